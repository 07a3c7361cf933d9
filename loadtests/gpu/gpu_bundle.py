"""The wheels `gpu_check.sh` carries to the GPU machine, which has no network: fetch, check, select.

    python loadtests/gpu/gpu_bundle.py download [--dest .whl]       # here: cp312 manylinux wheels of gpu_wheels.txt
    python loadtests/gpu/gpu_bundle.py check [--wheels .whl]        # one wheel per pin, none of torch/triton/nvidia-*,
                                                                #   under 64 MiB in all
    python loadtests/gpu/gpu_bundle.py select [--wheels .whl]       # there: the wheel files to install, one a line
    python loadtests/gpu/gpu_bundle.py dry-run OUT_DIR [-- gpu_check.py options]
        # here: gpu_check.sh end to end on the CPU, into a fresh venv that sees only a stand-in
        # of the GPU machine's image (this venv's copies of the packages in gpu_device_packages.txt,
        # torch among them, linked, never reinstalled), with this interpreter's wheels of the same pins

Standard library only: `check` and `select` run on the GPU machine before anything is
installed. `select` leaves out an `if-not` wheel (grpcio, protobuf) when the running
interpreter already has a version within the range kvserve needs, so the machine's own
copy is kept wherever it will do.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHEEL_LIST = HERE / "gpu_wheels.txt"
DEVICE_PACKAGES = HERE / "gpu_device_packages.txt"
LIMIT_BYTES = 64 * 2 ** 20  # what may travel with the working tree to the GPU machine, wheels included
FORBIDDEN = re.compile(r"^(torch|triton|nvidia[-_].*|pytorch[-_]triton.*)$")
# The GPU machine: CPython 3.12 on x86-64 glibc. pip matches each manylinux_2_N tag exactly.
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True, slots=True)
class Pin:
    name: str
    version: str
    only_if_not: str | None = None  # "protobuf >=6.33.5,<7": skipped when the machine's own fits

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


def read_pins(path: Path = WHEEL_LIST) -> list[Pin]:
    pins = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req, _, cond = line.partition(";")
        name, sep, version = req.strip().partition("==")
        if not sep or not version.strip():
            raise ValueError(f"{path.name}: {raw!r} is not pinned as NAME==VERSION")
        cond = cond.strip()
        if cond and not cond.startswith("if-not "):
            raise ValueError(f"{path.name}: {raw!r}: only '; if-not NAME SPEC' may follow a pin")
        pins.append(Pin(name.strip(), version.strip(), cond[len("if-not "):].strip() or None))
    return pins


def read_device_packages(path: Path = DEVICE_PACKAGES) -> set[str]:
    return {normalize(line.strip()) for line in path.read_text().splitlines() if line.strip() and line[0] != "#"}


def wheel_name(path: Path) -> tuple[str, str]:
    """(normalized distribution name, version) from a wheel's file name."""
    parts = path.name[:-len(".whl")].split("-")
    return normalize(parts[0]), parts[1]


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:4])


def version_within(version: str, spec: str) -> bool:
    """`1.85.3` within `>=1.81.1,<2`: numeric releases and >=, >, <=, <, == only (all the list needs)."""
    have = _version_tuple(version)
    for clause in spec.split(","):
        op, bound = re.match(r"\s*(>=|<=|==|>|<)\s*(\S+)", clause).groups()  # type: ignore[union-attr]
        want = _version_tuple(bound)
        n = max(len(have), len(want))
        a, b = have + (0,) * (n - len(have)), want + (0,) * (n - len(want))
        if not {">=": a >= b, "<=": a <= b, "==": a == b, ">": a > b, "<": a < b}[op]:
            return False
    return True


def check(wheels: Path, pins: list[Pin]) -> dict:
    """The bundle matches the list exactly; raises ValueError saying what is wrong."""
    files = sorted(wheels.glob("*.whl"))
    found: dict[str, list[Path]] = {}
    for f in files:
        found.setdefault(wheel_name(f)[0], []).append(f)
    problems = []
    for name, fs in found.items():
        if FORBIDDEN.match(name):
            problems.append(f"{name}: must never travel (the machine's CUDA build stays)")
        if len(fs) > 1:
            problems.append(f"{name}: {len(fs)} wheels ({', '.join(f.name for f in fs)}); two versions stop the install")
    for pin in pins:
        fs = found.get(normalize(pin.name), [])
        if not fs:
            problems.append(f"{pin.requirement}: no wheel in {wheels}")
        elif wheel_name(fs[0])[1] != pin.version:
            problems.append(f"{pin.requirement}: the wheel is {fs[0].name}")
    extra = set(found) - {normalize(p.name) for p in pins}
    problems += [f"{name}: a wheel not in {WHEEL_LIST.name}" for name in sorted(extra)]
    total = sum(f.stat().st_size for f in files)
    if total > LIMIT_BYTES:
        problems.append(f"{total / 2**20:.1f} MiB of wheels, over the {LIMIT_BYTES / 2**20:.0f} MiB that may travel")
    if problems:
        raise ValueError("; ".join(problems))
    return {"wheels": len(files), "total_bytes": total, "total_MiB": round(total / 2 ** 20, 2),
            "limit_MiB": LIMIT_BYTES / 2 ** 20, "files": [f.name for f in files]}


def select(wheels: Path, pins: list[Pin]) -> tuple[list[Path], dict[str, str]]:
    """Wheels to install here, and for each `if-not` pin why it was kept or left out."""
    chosen, reasons = [], {}
    for pin in pins:
        (wheel,) = [f for f in wheels.glob("*.whl") if wheel_name(f)[0] == normalize(pin.name)]
        if pin.only_if_not:
            name, spec = pin.only_if_not.split(None, 1)
            try:
                have = metadata.version(name)
            except metadata.PackageNotFoundError:
                have = None
            if have is not None and version_within(have, spec):
                reasons[pin.name] = f"kept the machine's {name} {have} ({spec})"
                continue
            reasons[pin.name] = f"installing {pin.version}: the machine has {have or 'none'}, kvserve needs {spec}"
        chosen.append(wheel)
    return chosen, reasons


def download(dest: Path, pins: list[Pin], python_version: str = PYTHON_VERSION) -> None:
    """pip download each pin alone (--no-deps: the list names every wheel), for the GPU machine's tags."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    if python_version != "local":
        cmd += ["--python-version", python_version, "--implementation", "cp"]
        for platform in PLATFORMS:
            cmd += ["--platform", platform]
    subprocess.run(cmd + [p.requirement for p in pins], check=True)


def _image_closure(device_packages: set[str], bundled: set[str]) -> dict[str, str]:
    """The machine's packages as installed here, plus what their local versions need.

    Local versions differ from the machine's (huggingface_hub here may need a package the
    machine's older one does not): whatever a linked package needs is linked too, since on
    the machine its own versions are consistent. Never a bundled name: those must come from
    the wheels. Returns {name: why it is in the image}."""
    from packaging.requirements import Requirement

    installed = {normalize(d.metadata["Name"] or ""): d for d in metadata.distributions()}
    env = {"python_version": ".".join(map(str, sys.version_info[:2])), "extra": ""}
    image = {n: "listed" for n in device_packages if n in installed}
    todo = list(image)
    while todo:
        for raw in installed[todo.pop()].requires or []:
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            name = normalize(req.name)
            if name in installed and name not in image and name not in bundled:
                image[name] = "needed by a listed package's local version"
                todo.append(name)
    return image


def standin_image(dest: Path, device_packages: set[str], bundled: set[str]) -> dict[str, str]:
    """Link this interpreter's installed copies of the GPU machine's packages into dest.

    Only those (and what their local versions need, see _image_closure): a fresh venv whose
    one .pth points here sees what the machine has (torch, transformers, pytest, setuptools,
    ...) and nothing that it lacks, so an install that works there is proven complete.
    Returns the distributions linked, each with why."""
    dest.mkdir(parents=True, exist_ok=True)
    image = _image_closure(device_packages, bundled)
    for dist in metadata.distributions():
        name = normalize(dist.metadata["Name"] or "")
        files = dist.files
        if name not in image or not files:
            continue
        tops = {Path(str(f)).parts[0] for f in files if not str(f).startswith("..")} - {"__pycache__"}
        base = Path(str(dist.locate_file("")))
        for top in tops:
            src, link = base / top, dest / top
            if src.exists() and not link.exists():
                link.symlink_to(src)
    return image


def dry_run(out: Path, check_args: list[str]) -> int:
    import tempfile
    import venv

    root = Path(tempfile.mkdtemp(prefix="kvserve-gpu-dry-"))
    print(f"dry run in {root}")
    pins = read_pins()
    linked = standin_image(root / "image", read_device_packages(), {normalize(p.name) for p in pins})
    (root / "image.json").write_text(json.dumps(linked, indent=2, sort_keys=True))
    added = sorted(n for n, why in linked.items() if why != "listed")
    print(f"stand-in image: {len(linked)} packages ({len(added)} only as needs of local versions: "
          f"{', '.join(added) or 'none'})")
    for required in ("torch", "pip", "setuptools", "pytest", "transformers"):
        if required not in linked:
            print(f"dry run: this interpreter has no {required}; the stand-in image needs it", file=sys.stderr)
            return 1
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    (site_packages,) = env_dir.glob("lib/python*/site-packages")
    (site_packages / "gpu_image.pth").write_text(str(root / "image") + "\n")
    wheels = root / "wheels"
    download(wheels, pins, "local")
    env = {**os.environ, "PYTHON": str(env_dir / "bin" / "python"), "KVSERVE_WHEELS": str(wheels),
           "KVSERVE_GPU_WORK": str(root / "work")}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    cmd = ["bash", str(HERE / "gpu_check.sh"), str(out), *check_args]
    try:
        rc = subprocess.run(cmd, env=env).returncode
    finally:
        shutil.rmtree(root, ignore_errors=True)  # the venv, the links, the models; the results stay in out
    print(f"dry run: gpu_check.sh exited {rc}; stand-in image of {len(linked)} packages; results in {out}")
    return rc


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["dry-run"]:
        rest = argv[1:]
        if not rest:
            print("usage: gpu_bundle.py dry-run OUT_DIR [gpu_check.py options]", file=sys.stderr)
            return 2
        return dry_run(Path(rest[0]), [a for a in rest[1:] if a != "--"])
    p = argparse.ArgumentParser(prog="gpu_bundle.py", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=("download", "check", "select"))
    p.add_argument("--wheels", "--dest", dest="wheels", default=str(HERE.parents[1] / ".whl"))
    p.add_argument("--python-version", default=PYTHON_VERSION,
                   help="download for this CPython (default: the GPU machine's); 'local': this interpreter")
    p.add_argument("--json", default=None, help="check/select: also write what was found here")
    args = p.parse_args(argv)
    pins, wheels = read_pins(), Path(args.wheels)
    try:
        if args.command == "download":
            download(wheels, pins, args.python_version)
            args.command = "check"
        if args.command == "check":
            report = check(wheels, pins)
            print(f"{report['wheels']} wheels, {report['total_MiB']} MiB (limit {report['limit_MiB']:.0f} MiB)")
        else:
            chosen, reasons = select(wheels, pins)
            report = {"install": [str(f) for f in chosen], "if_not": reasons}
            print("\n".join(report["install"]))
            for name, why in reasons.items():
                print(f"{name}: {why}", file=sys.stderr)
    except (ValueError, subprocess.CalledProcessError) as exc:
        print(f"gpu_bundle.py {args.command}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
