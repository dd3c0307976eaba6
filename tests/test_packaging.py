"""A non-editable install (`pip install .`, or a wheel from an index) holds every module and the model-card template,
so `shapeformers card` and `publish` work there as they do from a checkout."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent


def test_the_wheel_holds_every_module_and_the_card_template(tmp_path):
    source = tmp_path / "source"  # a copy, so the build leaves no build/ or egg-info in the checkout
    shutil.copytree(REPOSITORY, source, ignore=shutil.ignore_patterns(".*", "build", "dist", "runs", "*.egg-info"))
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp_path, source]
    subprocess.run(build, check=True, capture_output=True)
    (wheel,) = tmp_path.glob("shapeformers-*.whl")
    packed = set(zipfile.ZipFile(wheel).namelist())
    modules = {path.relative_to(REPOSITORY).as_posix() for path in (REPOSITORY / "shapeformers").rglob("*.py")}
    assert modules - packed == set()
    assert "shapeformers/model_cards/template.md" in packed

    installed = tmp_path / "installed"
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", installed, wheel]
    subprocess.run(install, check=True, capture_output=True)
    check = "import shapeformers.publishing as p; print(p.__file__); print(p.TEMPLATE.is_file())"
    result = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, env={"PYTHONPATH": str(installed)},
                            capture_output=True, text=True, check=True)  # fmt: skip
    module_file, template_found = result.stdout.split()
    assert Path(module_file).is_relative_to(installed) and template_found == "True"
