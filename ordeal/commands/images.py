"""``ordeal images build``: build (or reuse) the images of the containers provider (harness/containers/images.py)."""

from __future__ import annotations

import json
import os
import time

import click

from contracts.errors import UsageError


@click.group(name="images")
def images() -> None:
    """The container images of the containers provider."""


@images.command(name="build")
@click.argument("names", nargs=-1)
@click.option("--force", is_flag=True, help="Rebuild even when an image with the same content hash exists.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON record per image on stdout.")
def build(names: tuple[str, ...], force: bool, as_json: bool) -> None:
    """Build NAMES (default: all) from a debootstrap Debian base, reusing what is already built."""
    from harness.containers.images import ImageError, build_all

    began = time.monotonic()
    try:
        records = build_all(list(names) or None, force=force,
                            log=lambda text: click.echo(f"[{time.monotonic() - began:6.1f} s] {text}", err=True))
    except ImageError as error:
        raise UsageError(str(error)) from None
    click.echo(f"images ready in {time.monotonic() - began:.1f} s", err=True)
    if as_json:
        click.echo(json.dumps(records, indent=2))


def build_missing_images(scenario=None, *, names: list[str] | None = None) -> None:
    """Before a command that starts runs enters its private network namespace (where the Debian mirror cannot
    be reached): build the images its scenario (contracts.scenario.Scenario, or the image ``names``) needs on
    the containers provider and lacks, with progress on stderr (harness/containers/autobuild.py).  When they
    cannot be built here, say why once and go on: the run then stops at its start with the not-built error
    naming the same reason (as with ORDEAL_BUILD_IMAGES=0).  A build that started and failed: exit 3."""
    if (scenario is None and not names) or os.environ.get("ORDEAL_NETNS") in ("reexec", "private"):
        return  # inside the namespace already (the command's isolated re-run): the run's own check says why
    from harness.containers.autobuild import ENV, ensure_images, images_for_scenario
    from harness.containers.images import ImageError, image_reference

    wanted = names if names is not None else images_for_scenario(scenario)
    if not wanted:
        return
    try:
        outcome = ensure_images(wanted, lambda text: click.echo(text, err=True))
    except ImageError as error:
        raise UsageError(f"building the container images on first use failed ({ENV}=0 turns it off): "
                         f"{error}") from None
    if outcome.why_not:
        click.echo(f"images: not built: {', '.join(image_reference(name) for name in outcome.missing)}; "
                   f"not built on first use: {outcome.why_not}", err=True)


@images.command(name="list")
def list_images() -> None:
    """Each image the provider runs, its reference and whether it is built (content hash)."""
    from harness.containers.images import IMAGES, image_hash

    for spec in IMAGES:
        found = image_hash(spec.reference)
        click.echo(f"{spec.name:<12} {spec.reference:<44} {'missing' if found is None else found or '(no label)'}"
                   f"  {spec.description}")
