"""The plugin registry: built-ins come in through entry points exactly like third-party
plugins, a misspelled hook fails loudly, duplicate names warn, and an out-of-tree package
installed with pip shows up in `workbench list` and in models."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
import types
from pathlib import Path

import pluggy
import pytest
from conftest import installed_plugin, run_within_cpu

from workbench import hookimpl, hookspecs, registry
from workbench.model.position import PositionScheme
from workbench.variants import AXES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "workbench-example-plugin"
MODERN = ROOT / "examples" / "workbench-modern-plugins"


def entry_points() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["entry-points"]["workbench"]


def test_every_plugin_module_has_an_entry_point_and_vice_versa():
    """Each module of plugins/ (a variant or task) and each recipe of workbench/recipes/ (a study
    kind) is declared, under its own name, and nothing else is."""
    plugins = {p.stem: f"workbench_plugins.{p.stem}" for p in (ROOT / "plugins").glob("*.py") if p.stem != "__init__"}
    recipes = {f"kind_{p.parent.name}": f"workbench.recipes.{p.parent.name}.recipe"
               for p in (ROOT / "workbench" / "recipes").glob("*/recipe.py")}
    assert recipes, "no recipe found under workbench/recipes/"
    assert entry_points() == {**plugins, **recipes}


def test_every_entry_point_is_loaded_and_implements_a_hook():
    """The installed metadata matches pyproject.toml (else: reinstall with pip install -e .)."""
    pm = registry.plugin_manager()
    loaded = {getattr(p, "__name__", "") for p in pm.get_plugins()}
    for value in entry_points().values():
        assert value in loaded, f"{value} is declared but not installed: run pip install -e ."
        module = sys.modules[value]
        assert pm.get_hookcallers(module), f"{value} implements no workbench hook"


def test_every_hookspec_has_an_axis():
    specs = {name for name in dir(hookspecs) if name.startswith("register_")}
    assert specs == set(registry.HOOKS) == set(registry.HOOK_OF_AXIS.values()) | {"register_study_kinds"}
    assert set(registry.HOOK_OF_AXIS) == set(AXES)


def test_the_model_spec_names_the_model_axes_of_the_one_list():
    from workbench.model.spec import VARIANT_AXES, Choice, ModelSpec
    from workbench.variants import AXIS, MODEL_AXES

    assert VARIANT_AXES == MODEL_AXES and set(MODEL_AXES) <= set(ModelSpec.model_fields)
    default = ModelSpec()
    assert {field for field in ModelSpec.model_fields if isinstance(getattr(default, field), Choice)} == set(MODEL_AXES)
    for axis in MODEL_AXES:  # an axis added later defaults to what a stored model without it means
        if AXIS[axis].absent_means is not None:
            assert getattr(default, axis).name == AXIS[axis].absent_means and axis not in default.resolved()


def axis_name_lists(path: Path) -> list[int]:
    """Lines of `path` holding a tuple, list, set or call arguments of three or more axis names."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else node.args if isinstance(node, ast.Call) else []
        names = {e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        if len(names & set(AXES)) >= 3:
            lines.append(node.lineno)
    return lines


def test_the_axes_are_written_once():
    """AXIS (workbench/variants.py) is the one list of axes; every other list derives from it.
    One written out again (in the code, the built-ins or the tests) would miss an axis added later."""
    found = {f"{path.relative_to(ROOT)}:{line}" for folder in ("workbench", "plugins", "tests", "benchmarks")
             for path in sorted((ROOT / folder).rglob("*.py")) for line in axis_name_lists(path)}
    assert not found, f"the axes listed again at {', '.join(sorted(found))}: derive them from workbench.variants.AXIS"


def misspelled_plugin() -> types.ModuleType:
    module = types.ModuleType("misspelled_plugin")

    @hookimpl
    def register_position_scheme():  # missing the final "s"
        return []

    module.register_position_scheme = register_position_scheme
    return module


def test_a_misspelled_hookimpl_fails_loudly(monkeypatch):
    pm = pluggy.PluginManager(registry.ENTRY_POINT_GROUP)
    pm.add_hookspecs(hookspecs)
    pm.register(misspelled_plugin())
    with pytest.raises(pluggy.PluginValidationError, match="register_position_scheme"):
        pm.check_pending()


def fake_package(name: str) -> str:
    """An installed distribution as workbench_entry_points names it: "name version"."""
    return f"{name} 9.9"


class FakeEntryPoint:
    def __init__(self, name: str, load):
        self.name, self.value, self.load = name, name, load


def broken_import():
    raise ImportError("No module named 'torch_extra'")


def with_plugins(monkeypatch, *extra):
    """plugin_manager() as built from the installed entry points plus `extra` ones."""
    real = list(registry.workbench_entry_points())
    monkeypatch.setattr(registry, "workbench_entry_points", lambda: iter([*real, *extra]))
    registry.plugin_manager.cache_clear()
    registry.variants.cache_clear()


@pytest.fixture
def restore_registry():
    yield
    registry.plugin_manager.cache_clear()
    registry.variants.cache_clear()


def test_a_broken_plugin_is_one_warning_and_everything_else_works(monkeypatch, restore_registry):
    with_plugins(monkeypatch, (fake_package("wb-broken"), FakeEntryPoint("broken", broken_import)),
                 (fake_package("wb-typo"), FakeEntryPoint("typo", misspelled_plugin)))
    with pytest.warns(registry.PluginLoadWarning) as caught:
        pm = registry.plugin_manager()
    messages = sorted(str(w.message) for w in caught)
    assert messages == [
        "plugin 'broken' of package wb-broken 9.9 not loaded: ImportError: No module named 'torch_extra'",
        "plugin 'typo' of package wb-typo 9.9 not loaded: PluginValidationError: unknown hook "
        "'register_position_scheme'; did you mean 'register_position_schemes'?",
    ]
    assert not pm.has_plugin("typo") and "rope" in registry.variants("position")


def test_a_broken_plugin_leaves_the_cli_working_with_one_line(monkeypatch, restore_registry):
    from click.testing import CliRunner

    from workbench.cli import main

    with_plugins(monkeypatch, (fake_package("wb-broken"), FakeEntryPoint("broken", broken_import)))
    result = CliRunner().invoke(main, ["list", "ffn", "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ("warning: plugin 'broken' of package wb-broken 9.9 not loaded: "
                             "ImportError: No module named 'torch_extra'\n")
    assert {row["name"] for row in json.loads(result.stdout)} >= {"gelu", "swiglu"}


def test_builtins_name_their_package_and_version():
    assert registry.provider("position", "rope") == f"rope ({registry.distribution_of(registry.get_variant('position', 'rope'))})"
    assert registry.distribution_of(registry.get_variant("position", "rope")).startswith("transformer-workbench ")


class DuplicateRope(PositionScheme):
    """A second scheme that claims the name 'rope'."""

    name = "rope"


def test_an_installed_plugin_reusing_a_name_overrides_the_builtin_with_a_warning():
    with installed_plugin("duplicate_rope_plugin", register_position_schemes=[DuplicateRope]):
        with pytest.warns(UserWarning, match=r"'rope' from .*test_registry overrides workbench_plugins"):
            assert registry.variants("position")["rope"] is DuplicateRope
    assert registry.variants("position")["rope"] is not DuplicateRope


def test_a_class_registered_under_the_wrong_axis_is_left_out_with_a_warning():
    with installed_plugin("wrong_axis_plugin", register_ffn_types=[DuplicateRope]):
        with pytest.warns(registry.PluginLoadWarning, match="returned DuplicateRope, a class of axis 'position', "
                                                            "registered as ffn; left out"):
            assert "rope" not in registry.variants("ffn") and "gelu" in registry.variants("ffn")


# ---- a plugin is isolated at the boundary (issue 47) ----------------------------------------


def raising(error: BaseException):
    def load():
        raise error
    return load


@pytest.mark.parametrize("error", [SystemExit(0), KeyboardInterrupt(), GeneratorExit(), RuntimeError("boom")])
def test_anything_raised_at_import_is_one_warning_and_every_command_works(monkeypatch, restore_registry, error):
    """SystemExit(0) at import made `workbench list` exit 0 with no output at all."""
    from click.testing import CliRunner

    from workbench.cli import main

    with_plugins(monkeypatch, (fake_package("wb-exits"), FakeEntryPoint("exits", raising(error))))
    result = CliRunner().invoke(main, ["list", "ffn", "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr == f"warning: plugin 'exits' of package wb-exits 9.9 not loaded: {registry.first_line(error)}\n"
    assert {row["name"] for row in json.loads(result.stdout)} >= {"gelu", "swiglu"}


class NoAxis:
    """An object without `axis`."""


def plugin_module(**hooks) -> types.ModuleType:
    module = types.ModuleType("wb_malformed")
    for hook, result in hooks.items():
        setattr(module, hook, hookimpl(result if callable(result) else lambda result=result: result))
    return module


@pytest.mark.parametrize("hook, returned, problem", [
    ("register_ffn_types", 5, "returned 5, not a list of classes"),
    ("register_ffn_types", ["x", 3], "returned 'x', which is not a FFN type class (a subclass of the workbench's "
                                     "base class) (and 1 more such item)"),
    ("register_ffn_types", [NoAxis], "returned NoAxis, which is not a FFN type class"),
    ("register_ffn_types", [DuplicateRope], "returned DuplicateRope, a class of axis 'position', registered as ffn"),
    ("register_ffn_types", raising(SystemExit(3)), "register_ffn_types() failed (SystemExit: 3)"),
    ("register_study_kinds", ["train"], "returned 'train', which is not a StudyKind class"),
])
def test_a_malformed_hook_result_is_one_warning_naming_the_plugin(monkeypatch, restore_registry, hook, returned,
                                                                  problem):
    from click.testing import CliRunner

    from workbench.cli import main
    from workbench.kinds import study_kinds

    study_kinds.cache_clear()
    module = plugin_module(**{hook: returned})
    with_plugins(monkeypatch, (fake_package("wb-malformed"), FakeEntryPoint("malformed", lambda: module)))
    study = ROOT / "studies" / "tiny.yaml"
    result = CliRunner().invoke(main, ["validate", str(study)])
    study_kinds.cache_clear()
    assert result.exit_code == 0 and result.stdout.startswith("ok: "), result.output
    [warning] = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warning.startswith(f"warning: plugin 'malformed' of package wb-malformed 9.9: {hook}() ")
    assert problem in warning and warning.endswith("; left out")


def test_a_third_party_entry_point_named_like_a_builtin_is_refused_naming_both(monkeypatch, restore_registry):
    """`position_rope` from another package removed the built-in rope: 'unknown position scheme'."""
    impostor = plugin_module(register_position_schemes=[])
    real = list(registry.workbench_entry_points())
    extra = (fake_package("wb-impostor"), FakeEntryPoint("position_rope", lambda: impostor))
    monkeypatch.setattr(registry, "workbench_entry_points", lambda: iter([extra, *real]))  # listed first
    registry.plugin_manager.cache_clear()
    registry.variants.cache_clear()
    with pytest.warns(registry.PluginLoadWarning) as caught:
        assert "rope" in registry.variants("position")
    assert [str(w.message) for w in caught] == [
        "plugin 'position_rope' of package wb-impostor 9.9 not loaded: its entry point name is that of plugin "
        f"'position_rope' of package {registry.distribution_of(registry.get_variant('position', 'rope'))}, which it "
        "may not replace; rename its entry point"]


# ---- the example out-of-tree plugin, installed with pip --------------------------------------


def installed_site(package: Path, tmp_path_factory):
    """pip-install `package` into a private site directory, yield the directory.

    A real install (wheel built by setuptools, dist-info with entry_points.txt), but into a
    --target folder put on PYTHONPATH of subprocesses rather than into the shared
    environment, so tests running at the same time in other processes never see a half-
    installed plugin; deleting the folder uninstalls it. Built from a copy so that the build
    leaves no build/ or egg-info folders in the source tree."""
    work = tmp_path_factory.mktemp(package.name)
    source, site = work / "src", work / "site"
    shutil.copytree(package, source, ignore=shutil.ignore_patterns("report"))
    run_within_cpu([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check", "--target", str(site), str(source)],
                   120, check=True, text=True)
    yield site
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def example_plugin_site(tmp_path_factory) -> Path:
    """examples/workbench-example-plugin, pip-installed into a private site directory."""
    yield from installed_site(EXAMPLE, tmp_path_factory)


@pytest.fixture(scope="session")
def modern_plugins_site(tmp_path_factory) -> Path:
    """examples/workbench-modern-plugins, pip-installed into a private site directory."""
    yield from installed_site(MODERN, tmp_path_factory)


def run_with_plugin(site: Path, args: list[str], cpu_budget_s: float = 300) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")  # tiny models: one thread is fastest
    result = run_within_cpu([sys.executable, *args], cpu_budget_s, cwd=ROOT, env=env, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_example_plugin_appears_in_workbench_list(example_plugin_site):
    rows = json.loads(run_with_plugin(example_plugin_site, ["-m", "workbench.cli", "list", "position", "--json"]).stdout)
    kerple = next(r for r in rows if r["name"] == "kerple")
    assert kerple["package"] == "workbench-example-plugin 0.1.0"
    assert [p["name"] for p in kerple["parameters"]] == ["eps"]
    assert {r["name"] for r in rows} >= {"none", "sinusoidal", "learned", "rope", "alibi", "kerple"}


@pytest.mark.slow
def test_example_plugin_builds_trains_and_decodes(example_plugin_site):
    script = textwrap.dedent(
        """
        import torch, workbench
        from workbench.registry import get_variant
        assert get_variant("position", "kerple").__module__ == "workbench_example_plugin"
        torch.manual_seed(0)
        for family in ("encoder", "decoder", "encoder_decoder"):
            model = workbench.build_model({"family": family, "vocab_size": 32, "d_model": 16, "n_heads": 4,
                                           "n_kv_heads": 2, "position": {"name": "kerple", "eps": 0.02}})
            x = torch.randint(2, 32, (2, 7))
            out = model(x, x) if family == "encoder_decoder" else model(x)
            out.logsumexp(-1).mean().backward()
            scheme = model.decoder.position if family != "encoder" else model.encoder.position
            assert scheme.r1.grad is not None and torch.isfinite(scheme.r1.grad).all()
            if family != "encoder":
                model.eval()
                a = model.generate(x, max_new_tokens=5, use_cache=True)
                b = model.generate(x, max_new_tokens=5, use_cache=False)
                assert torch.equal(a, b), (a, b)
        print("ok")
        """
    )
    assert run_with_plugin(example_plugin_site, ["-c", script]).stdout.strip() == "ok"


@pytest.mark.slow
def test_registry_parametrized_contract_tests_cover_the_new_plugin(example_plugin_site):
    """The timm-style promise: the generic tests pick up an installed plugin by themselves."""
    result = run_with_plugin(
        example_plugin_site,
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_model_contract.py", "-k", "kerple"],
    )
    assert " passed" in result.stdout and "failed" not in result.stdout, result.stdout[-2000:]
    selected = int(result.stdout.split(" passed")[0].split()[-1])
    assert selected >= 4, result.stdout[-2000:]  # forward/backward per family, classify, dense-reference cases


# ---- the example package of 2024-2026 modifications (issue 60) -----------------------------

MODERN_VARIANTS = {"qk_norm_attention": "attention", "gated_attention": "attention", "diff_attention": "attention",
                   "value_residual_attention": "attention", "topk_moe": "ffn", "ademamix": "optimizer"}


@pytest.mark.slow
def test_the_modern_plugins_pass_the_contract_tests_with_no_test_of_their_own(modern_plugins_site):
    listed = json.loads(run_with_plugin(modern_plugins_site, ["-m", "workbench.cli", "list", "--json"]).stdout)
    found = {row["name"]: (row["axis"], row["package"]) for row in listed}
    for name, axis in MODERN_VARIANTS.items():
        assert found[name] == (axis, "workbench-modern-plugins 0.1.0"), name
    model_variants = " or ".join(name for name, axis in MODERN_VARIANTS.items() if axis != "optimizer")
    result = run_with_plugin(modern_plugins_site, ["-m", "pytest", "-q", "-p", "no:cacheprovider",
                                                   "tests/test_model_contract.py", "tests/model/test_transformer_properties.py",
                                                   "-k", model_variants], cpu_budget_s=900)
    assert "failed" not in result.stdout and " passed" in result.stdout, result.stdout[-2000:]
    assert int(result.stdout.split(" passed")[0].split()[-1]) >= 5 * 10, result.stdout[-2000:]


@pytest.mark.slow
def test_the_modern_plugins_train_in_their_study_to_a_report(modern_plugins_site, tmp_path):
    """The package's study (shortened here: one seed, 40 steps) trains each modification through
    `workbench run` and writes its report; the MoE arm's balance loss is a curve of its own."""
    out = tmp_path / "runs"
    run_with_plugin(modern_plugins_site, ["-m", "workbench.cli", "run", str(MODERN / "study.yaml"), "--out", str(out),
                                          "--set", "train.steps=40", "--set", "train.eval_every=20",
                                          "--set", "seeds=[0]", "--jobs", "1"], cpu_budget_s=1200)
    report = (out / "reports" / "modern-plugins" / "report.md").read_text()
    for name in MODERN_VARIANTS:
        assert name in report, name
    rows = json.loads(run_with_plugin(modern_plugins_site, ["-m", "workbench.cli", "results", str(out),
                                                            "--format", "json"]).stdout)
    assert len(rows) == 7 and all(row["status"] == "finished" for row in rows), rows
# ---- a plugin's import is bounded in time (issue 64) ------------------------------------------


def test_a_plugin_that_hangs_at_import_is_left_out_with_one_warning_and_the_cli_works(monkeypatch, restore_registry):
    """A plugin whose import never returns (here: until the test ends) made `workbench list`
    wait silently. It is left out once its time is up, with one warning naming it; the built-ins
    (imported already, so in microseconds) are all there."""
    import threading

    from click.testing import CliRunner

    from workbench.cli import main

    release = threading.Event()

    def hangs():
        release.wait()
        return plugin_module(register_ffn_types=[])

    monkeypatch.setenv("WORKBENCH_PLUGIN_IMPORT_SECONDS", "2")
    with_plugins(monkeypatch, (fake_package("wb-hangs"), FakeEntryPoint("hangs", hangs)))
    try:
        result = CliRunner().invoke(main, ["list", "ffn", "--json"])
    finally:
        release.set()  # the import left running in the background ends with the test
    assert result.exit_code == 0, result.output
    assert result.stderr == ("warning: plugin 'hangs' of package wb-hangs 9.9 not loaded: its import did not return "
                             "within 2 s (it goes on in the background; set WORKBENCH_PLUGIN_IMPORT_SECONDS to wait "
                             "longer)\n")
    assert {row["name"] for row in json.loads(result.stdout)} >= {"gelu", "swiglu"}
    assert not registry.plugin_manager().has_plugin("hangs")


@pytest.mark.parametrize("value, seconds", [("2.5", 2.5), ("0", 60.0), ("-1", 60.0), ("inf", 60.0), ("nan", 60.0),
                                            ("soon", 60.0)])
def test_the_import_time_is_a_positive_finite_number_or_the_default(monkeypatch, value, seconds):
    monkeypatch.setenv("WORKBENCH_PLUGIN_IMPORT_SECONDS", value)
    assert registry.plugin_import_seconds() == seconds == (seconds if value == "2.5" else registry.PLUGIN_IMPORT_SECONDS)
