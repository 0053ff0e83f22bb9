"""`workbench new-plugin AXIS NAME`: the generated package works as generated. Fast tests put
the generated module on sys.path and register it with the plugin manager (what its entry point
does once installed); the slow test really pip-installs it and runs the contract suite."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import run_within_cpu

import test_model_contract as contract
from workbench import registry
from workbench.cli import main
from workbench.variants import AXES, MODEL_AXES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def generated(tmp_path, monkeypatch):
    """generate(axis, name) -> (package folder, module), the module registered with the plugin manager."""
    registered = []

    def generate(axis: str, name: str):
        result = CliRunner().invoke(main, ["new-plugin", axis, name, "--dir", str(tmp_path)])
        assert result.exit_code == 0, result.output
        root = tmp_path / f"workbench-{name.replace('_', '-')}"
        monkeypatch.syspath_prepend(str(root))
        module = importlib.import_module(f"workbench_{name}")
        registry.plugin_manager().register(module)
        registry.variants.cache_clear()
        registered.append(module)
        return root, module

    yield generate
    for module in registered:
        registry.plugin_manager().unregister(module)
        sys.modules.pop(module.__name__, None)
    registry.variants.cache_clear()


def run_tests_of(path: Path) -> int:
    """Call every test function of a generated test file (they take no fixtures)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tests)
    functions = [f for n, f in inspect.getmembers(tests, inspect.isfunction) if n.startswith("test_")]
    for test in functions:
        test()
    return len(functions)


@pytest.mark.parametrize("axis", AXES)
def test_the_generated_package_passes_its_own_tests(generated, axis):
    name = f"scaffolded_{axis}"
    root, module = generated(axis, name)
    assert f'{name} = "workbench_{name}"' in (root / "pyproject.toml").read_text()
    cls = registry.get_variant(axis, name)
    assert cls.Params.__doc__ and all(f.description for f in cls.Params.model_fields.values())
    assert run_tests_of(root / "tests" / f"test_workbench_{name}.py") == 3


@pytest.mark.parametrize("axis", MODEL_AXES)
@pytest.mark.parametrize("family", contract.FAMILIES)
def test_the_generated_variant_passes_the_contract_tests(generated, axis, family):
    name = f"contract_{axis}"
    generated(axis, name)
    contract.test_variant_forward_backward_finite_with_documented_shapes(axis, name, family)
    if family == "encoder":
        contract.test_variant_encoder_classifies_padded_batches(axis, name)


def test_bad_names_and_taken_names_are_one_line(tmp_path):
    for args, fragment in ((["ffn", "My-FFN"], "not a valid variant name"), (["ffn", "gelu"], "already a registered"),
                           (["fnn", "x"], "'fnn' is not one of")):
        result = CliRunner().invoke(main, ["new-plugin", *args, "--dir", str(tmp_path)])
        assert result.exit_code == 2 and fragment in result.output, result.output


@pytest.mark.slow
def test_pip_installed_it_passes_the_workbench_contract_suite(tmp_path):
    """A real install (wheel, dist-info, entry point) into a private --target folder."""
    run_within_cpu([sys.executable, "-m", "workbench.cli", "new-plugin", "attention", "scaffold_attn",
                    "--dir", str(tmp_path)], 120, check=True)
    site = tmp_path / "site"
    run_within_cpu([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check", "--target", str(site),
                    str(tmp_path / "workbench-scaffold-attn")], 120, check=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    # a wide terminal: this checks the install (tests/cli/test_cli_list.py checks the layout at 80 columns)
    listed = run_within_cpu([sys.executable, "-m", "workbench.cli", "list", "attention"], 120,
                            env={**env, "COLUMNS": "160"}, cwd=ROOT, text=True)
    assert "scaffold_attn" in listed.stdout and "workbench-scaffold-attn 0.1.0" in listed.stdout
    result = run_within_cpu([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                             "tests/test_model_contract.py", "-k", "scaffold_attn",
                             str(tmp_path / "workbench-scaffold-attn" / "tests")],
                            600, env=env, cwd=ROOT, text=True)
    assert result.returncode == 0 and " passed" in result.stdout, result.stdout[-3000:] + result.stderr[-2000:]
    assert int(result.stdout.split(" passed")[0].split()[-1]) >= 10, result.stdout[-2000:]


def test_the_test_extra_installs_what_the_contract_tests_import(generated):
    """`pip install -e 'workbench-NAME[test]'` then `pytest tests/test_model_contract.py -k NAME`
    (the README's commands): every package those tests import is the workbench's own runtime
    dependency or in the generated `[test]` extra."""
    import ast
    import re
    import tomllib
    from importlib.metadata import packages_distributions, requires

    root, _ = generated("ffn", "extra_check")
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    name = re.compile(r"[A-Za-z0-9._-]+")
    runtime = {name.match(r).group().lower() for r in requires("transformer-workbench") if "extra ==" not in r}
    installed = {name.match(r).group().lower() for r in extra} | runtime
    imported = set()
    for path in (ROOT / "tests" / "test_model_contract.py", ROOT / "tests" / "conftest.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"conftest", "workbench", "workbench_plugins", "__future__"}
    distributions = packages_distributions()
    missing = {m for m in third_party if not {d.lower() for d in distributions.get(m, [m])} & installed}
    assert not missing, f"the [test] extra ({extra}) lacks what tests/test_model_contract.py imports: {missing}"
