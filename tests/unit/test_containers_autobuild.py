"""The containers provider's images built on first use (harness/containers/autobuild.py): which images a
scenario needs, whether the missing ones can be built here and why not (a pure decision), the progress a build
says, the not-built error naming why, and the CLI step before the namespace.  The image store is stubbed at its
own function boundary (``missing_names``) and the build at ``build_all``: no Podman, no network."""

from __future__ import annotations

import dataclasses

import pytest

import harness.model  # noqa: F401  (registers the stages into the scenario model)
from contracts.errors import UsageError
from contracts.scenario import load_scenario, with_provider
from harness.containers import autobuild
from harness.containers.autobuild import (
    Conditions,
    decide,
    ensure_images,
    images_for_scenario,
    not_built_message,
)
from harness.containers.images import ImageError, _debootstrap_phase, _podman_step, image_reference

HOST = Conditions(mirror="http://deb.debian.org/debian")  # root, podman and debootstrap, the host's network


def test_nothing_missing_builds_nothing_and_refuses_nothing():
    decision = decide([], dataclasses.replace(HOST, switch="0", netns="private", uid=1000))
    assert decision.build == () and not decision.refused


def test_on_the_host_as_root_the_missing_images_are_built():
    decision = decide(["debian-base", "redis"], HOST)
    assert decision.build == ("debian-base", "redis") and not decision.refused


@pytest.mark.parametrize("change, reason", [
    ({"switch": "0"}, "building on first use is off (ORDEAL_BUILD_IMAGES=0)"),
    ({"switch": "off"}, "building on first use is off (ORDEAL_BUILD_IMAGES=off)"),
    ({"netns": "private"}, "inside the run's private network namespace (ORDEAL_NETNS=private), where debootstrap"),
    ({"netns": "reexec"}, "inside the run's private network namespace (ORDEAL_NETNS=reexec)"),
    ({"uid": 1000}, "building needs root"),
    ({"podman": False}, "podman is not installed"),
    ({"debootstrap": False}, "debootstrap is not installed"),
    ({"mirror_error": "deb.debian.org:80: [Errno -3] Temporary failure in name resolution"},
     "no network: the Debian mirror http://deb.debian.org/debian is not reachable from here (deb.debian.org:80"),
    ({"docker_host": "unix:///var/run/docker.sock"}, "ORDEAL_DOCKER_HOST=unix:///var/run/docker.sock is the run's engine"),
])
def test_each_reason_a_build_is_impossible_is_named(change, reason):
    decision = decide(["debian-base", "mosquitto"], dataclasses.replace(HOST, **change))
    assert decision.refused and decision.build == ()
    assert reason in decision.why_not, decision.why_not


def test_debootstrap_is_needed_only_for_the_debian_base():
    assert decide(["mosquitto"], dataclasses.replace(HOST, debootstrap=False)).build == ("mosquitto",)


def test_switched_off_wins_over_every_other_reason():
    conditions = dataclasses.replace(HOST, switch="false", netns="private", uid=1000, podman=False)
    assert "off (ORDEAL_BUILD_IMAGES=false)" in decide(["redis"], conditions).why_not


def test_an_image_without_a_recipe_or_of_the_users_own_is_never_built():
    unknown = decide(["debian-base", "mybroker"], HOST)
    assert unknown.refused and "no recipe for an image 'mybroker'" in unknown.why_not
    assert "ORDEAL_IMAGE_MYBROKER" in unknown.why_not
    own = decide(["broker"], dataclasses.replace(HOST, overrides={"broker": "tbmq:2.0"}))
    assert own.refused and "ORDEAL_IMAGE_BROKER names your own image 'tbmq:2.0'" in own.why_not


def test_conditions_read_the_switch_and_the_namespace_from_the_environment():
    assert not Conditions.here(["redis"], {"ORDEAL_BUILD_IMAGES": "0"}, probe=False).enabled
    assert not Conditions.here(["redis"], {"ORDEAL_BUILD_IMAGES": " No "}, probe=False).enabled
    assert Conditions.here(["redis"], {"ORDEAL_BUILD_IMAGES": "1"}, probe=False).enabled
    assert Conditions.here(["redis"], {}, probe=False).enabled  # unset: on
    here = Conditions.here(["broker"], {"ORDEAL_NETNS": "private", "ORDEAL_IMAGE_BROKER": "tbmq:2.0"})
    assert here.netns == "private" and here.overrides == {"broker": "tbmq:2.0"}
    assert here.mirror_error == ""  # refused already: the network is not asked


def test_the_mirror_probe_names_what_it_could_not_reach():
    why = autobuild.mirror_unreachable("http://127.0.0.1:1/debian", {})  # nothing listens on port 1
    assert why.startswith("127.0.0.1:1: ") and "refused" in why.lower(), why
    assert autobuild.mirror_unreachable("file:///srv/mirror", {}) == ""  # nothing to probe


def test_the_not_built_error_keeps_its_words_and_names_why():
    message = not_built_message(["debian-base", "mosquitto"], "building on first use is off (ORDEAL_BUILD_IMAGES=0)",
                                "in the host's network namespace, as root")
    assert message.startswith(f"container image(s) not built: {image_reference('debian-base')}, "
                              f"{image_reference('mosquitto')}; run `ordeal images build` (in the host's network")
    assert message.endswith("not built on first use: building on first use is off (ORDEAL_BUILD_IMAGES=0)")


def test_the_images_a_scenario_needs_on_each_provider(monkeypatch):
    monkeypatch.delenv("ORDEAL_IMAGE_MOSQUITTO", raising=False)
    reference = load_scenario("scenarios/p2p-smoke.toml")
    assert images_for_scenario(reference) == []  # the local provider runs no image
    assert images_for_scenario(with_provider(reference, "containers")) == ["debian-base", "redis", "kafka", "s3",
                                                                           "broker"]
    external = load_scenario("scenarios/mosquitto-smoke.toml")
    assert images_for_scenario(external) == []
    assert images_for_scenario(with_provider(external, "containers")) == ["debian-base", "mosquitto"]
    monkeypatch.setenv("ORDEAL_IMAGE_MOSQUITTO", "example.org/mosquitto:2")  # the user's own: nothing to check
    assert images_for_scenario(with_provider(external, "containers")) == []


def test_ensure_builds_what_is_missing_with_progress_then_checks_again(monkeypatch):
    store = {"debian-base"}  # what the stubbed image store holds
    built: list[list[str]] = []

    def build_all(names, log):
        built.append(names)
        log("mosquitto: STEP 1/5: FROM localhost/ordeal/debian-base:bookworm")
        store.update(names)
        return [{"name": name, "action": "built"} for name in names]

    monkeypatch.setattr(autobuild, "build_all", build_all)
    lines: list[str] = []
    outcome = ensure_images(["debian-base", "mosquitto"], lines.append,
                            check=lambda names: [n for n in names if n not in store], conditions=lambda _m: HOST)
    assert built == [["mosquitto"]] and outcome.why_not == "" and outcome.missing == ("mosquitto",)
    assert lines[0].startswith("images [") and "not built yet: localhost/ordeal/mosquitto" in lines[0]
    assert "ORDEAL_BUILD_IMAGES=0 turns this off" in lines[0]
    assert any(line.endswith("] mosquitto: STEP 1/5: FROM localhost/ordeal/debian-base:bookworm") for line in lines)
    assert lines[-1].endswith("] ready")
    # every line carries the seconds since the build began
    assert all(line.startswith("images [") and " s] " in line for line in lines)


def test_ensure_says_nothing_and_returns_why_when_it_cannot_build(monkeypatch):
    monkeypatch.setattr(autobuild, "build_all", lambda *a, **k: pytest.fail("must not build"))
    lines: list[str] = []
    outcome = ensure_images(["debian-base", "mosquitto"], lines.append, check=lambda names: list(names),
                            conditions=lambda _m: dataclasses.replace(HOST, netns="private"))
    assert lines == [] and outcome.missing == ("debian-base", "mosquitto")
    assert "private network namespace" in outcome.why_not
    nothing = ensure_images(["redis"], lines.append, check=lambda names: [], conditions=lambda _m: 1 / 0)
    assert nothing.missing == () and lines == []  # all there: the conditions are not even asked


def test_ensure_fails_when_the_build_left_an_image_missing(monkeypatch):
    monkeypatch.setattr(autobuild, "build_all", lambda names, log: [{"name": n} for n in names])
    with pytest.raises(ImageError, match="still missing: mosquitto"):
        ensure_images(["mosquitto"], lambda _line: None, check=lambda names: list(names),
                      conditions=lambda _m: HOST)


def test_the_command_step_notes_a_refusal_and_goes_on(monkeypatch, capsys):
    from ordeal.commands.images import build_missing_images

    monkeypatch.delenv("ORDEAL_NETNS", raising=False)  # as the command before it enters its namespace
    monkeypatch.setenv("ORDEAL_BUILD_IMAGES", "0")
    monkeypatch.setattr(autobuild, "missing_names", lambda names: list(names))
    build_missing_images(names=["debian-base", "mosquitto"])
    err = capsys.readouterr().err
    assert err.startswith(f"images: not built: {image_reference('debian-base')}, {image_reference('mosquitto')}")
    assert "not built on first use: building on first use is off (ORDEAL_BUILD_IMAGES=0)" in err


def test_the_command_step_is_skipped_inside_the_namespace(monkeypatch, capsys):
    from ordeal.commands.images import build_missing_images

    monkeypatch.setenv("ORDEAL_NETNS", "reexec")  # the command's own re-run inside its namespace
    monkeypatch.setattr(autobuild, "missing_names", lambda names: pytest.fail("must not look"))
    build_missing_images(names=["mosquitto"])
    assert capsys.readouterr().err == ""


def test_a_build_that_fails_is_a_usage_error(monkeypatch):
    from ordeal.commands.images import build_missing_images

    monkeypatch.delenv("ORDEAL_NETNS", raising=False)
    monkeypatch.delenv("ORDEAL_BUILD_IMAGES", raising=False)
    monkeypatch.setattr(autobuild, "missing_names", lambda names: list(names))
    monkeypatch.setattr(autobuild.Conditions, "here", classmethod(lambda cls, names, *a, **k: HOST))

    def failing(names, log):
        raise ImageError("debootstrap failed (1); is the mirror reachable")

    monkeypatch.setattr(autobuild, "build_all", failing)
    with pytest.raises(UsageError, match=r"building the container images on first use failed \(ORDEAL_BUILD_IMAGES=0 "
                                         r"turns it off\): debootstrap failed"):
        build_missing_images(names=["debian-base"])


def test_progress_keeps_podman_steps_and_one_line_per_debootstrap_phase():
    assert _podman_step("STEP 2/5: RUN apt-get update") == "STEP 2/5: RUN apt-get update"
    assert _podman_step("COMMIT localhost/ordeal/redis:bookworm")
    assert _podman_step("Get:1 http://deb.debian.org/debian bookworm InRelease") is None
    assert _debootstrap_phase("I: Retrieving adduser 3.134") == _debootstrap_phase("I: Retrieving apt 2.6.1")
    assert _debootstrap_phase("I: Extracting libc6...") != _debootstrap_phase("I: Retrieving apt 2.6.1")
    assert _debootstrap_phase("W: something") is None
