"""``ordeal images build``: build (or reuse) the images of the containers provider (harness/containers/images.py)."""

from __future__ import annotations

import json
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
        records = build_all(list(names) or None, force=force, log=lambda text: click.echo(text, err=True))
    except ImageError as error:
        raise UsageError(str(error)) from None
    click.echo(f"images ready in {time.monotonic() - began:.1f} s", err=True)
    if as_json:
        click.echo(json.dumps(records, indent=2))


@images.command(name="list")
def list_images() -> None:
    """Each image the provider runs, its reference and whether it is built (content hash)."""
    from harness.containers.images import IMAGES, image_hash

    for spec in IMAGES:
        found = image_hash(spec.reference)
        click.echo(f"{spec.name:<12} {spec.reference:<44} {'missing' if found is None else found or '(no label)'}"
                   f"  {spec.description}")
