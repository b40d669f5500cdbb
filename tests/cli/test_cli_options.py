"""Options and flags across commands (issue 21): one naming rule for family options, one
meaning per flag name, one spelling of fit-head, and library errors that name parameters while
the command line shows its flags."""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections import defaultdict

import pytest
from conftest import one_line, says

from attnscope.cli.main import build_command, main
from attnscope.cli.options import _type_name
from attnscope.errors import AttnscopeError
from attnscope.families import load_families

#: Flags whose help says what they are for in their own command (which output, which model,
#: whose seed); their value kind is still the same everywhere.
HELP_PER_COMMAND = {"--out", "--model", "--max-seq-len", "--seed", "--resume", "--overwrite"}


def _commands(command, path=()):
    yield path, command
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _commands(sub, (*path, name))


def _options(command):
    return [p for p in command.params if getattr(p, "param_type_name", "") == "option"]


def _value_kind(param) -> tuple:
    """What a flag takes: (type, choices, switch?, repeatable?)."""
    annotation = param.type_descriptor.annotation
    args = [a for a in (typing.get_args(annotation) or (annotation,)) if a is not type(None)]
    choices = ()
    if isinstance(args[0], type) and issubclass(args[0], enum.Enum):
        choices = tuple(m.value for m in args[0])
    return _type_name(param), choices, bool(param.is_flag), bool(param.multiple)


def _expected_flag(key: str, field: str) -> str:
    """The rule of docs/families.md, written out again here: the family's key, then the field,
    unless the field already starts with the key."""
    words = field.split("_")
    if words[0] != key:
        words = [key, *words]
    return "--" + "-".join(words)


def _help_flags(capsys, argv) -> set[str]:
    """The long flags that open the lines of ``argv --help``; every flag its help text mentions
    must be one of them (a renamed flag left in a help text fails here)."""
    import re

    assert main([*argv, "--help"]) == 0
    out = capsys.readouterr().out
    opening = set()
    for line in out.splitlines():
        for w in line.replace(",", " ").split():
            if not w.startswith("-"):
                break
            opening.add(w)
    mentioned = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", out))
    assert mentioned <= opening, (argv, mentioned - opening)
    return {f for f in opening if f.startswith("--")}


def test_every_family_option_has_its_familys_prefix_in_run_and_analyze(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    run_flags = _help_flags(capsys, ["run"])
    expected = set()
    for fam in load_families():
        analyze_flags = _help_flags(capsys, ["analyze", fam.key])
        for f in dataclasses.fields(fam.Options):
            flag = _expected_flag(fam.key, f.name)
            assert flag in run_flags and flag in analyze_flags, (fam.key, f.name, flag)
            expected.add(flag)
    # the bare names of before are gone (each meant something else in another command)
    for old in ("--dtype", "--window", "--engine", "--chunk", "--gradients", "--delimiter-threshold",
                "--epochs", "--ablation", "--fit-mlm-head"):
        assert old not in run_flags, old
    # and every other option of run is an input or a shared setting, none a family option
    inputs = {i.flag for fam in load_families() for i in fam.inputs}
    shared = {"--out", "--model", "--max-seq-len", "--batch-size", "--seed", "--device", "--save-maps",
              "--resume", "--overwrite", "--ray", "--workers", "--explain", "--quiet", "--help"}
    assert run_flags == expected | inputs | shared


def test_a_flag_name_means_one_thing_in_every_command():
    """Collected from the built command tree: each flag takes the same kind of value (type,
    choices, switch, repeatable) in every command, with the same help text unless the help
    names the command's own output or input (:data:`HELP_PER_COMMAND`). Before issue 21
    --dtype was storage precision in extract and forward precision in analyze longctx,
    --window rows in view and truncate/sliding in analyze coref, --save-maps a switch in run and
    a folder in analyze."""
    kinds: dict[str, dict[str, tuple]] = defaultdict(dict)
    helps: dict[str, dict[str, str]] = defaultdict(dict)
    for path, command in _commands(build_command()):
        for param in _options(command):
            for flag in (o for o in (*param.opts, *param.secondary_opts) if o.startswith("--")):
                kinds[flag][" ".join(path)] = _value_kind(param)
                helps[flag][" ".join(path)] = param.help or ""
    assert {"--dtype", "--coref-window", "--window", "--save-maps"} <= set(kinds)
    for flag, by_command in kinds.items():
        assert len(set(by_command.values())) == 1, (flag, by_command)
        if flag not in HELP_PER_COMMAND:
            assert len(set(helps[flag].values())) == 1, (flag, helps[flag])
    assert set(kinds["--save-maps"]) == {"run", "analyze general", "analyze syntax"}
    assert kinds["--save-maps"]["run"] == ("bool", (), True, False)


@pytest.mark.heavy
def test_analyze_save_maps_is_the_switch_of_run(tmp_path, capsys):
    """``analyze general --save-maps`` keeps the maps where ``run --save-maps`` does,
    OUT/maps/general; run again into the same OUT it replaces them, as it replaces its tables
    (it has no --resume or --overwrite to recommend); a folder there that holds other files is
    refused, naming the flag, and left as it was."""
    import shutil

    from attnscope.store import open_store

    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat .\nthe dog ran .\n\na bird flew .\nit sang .\n")
    out = tmp_path / "o"
    argv = ["analyze", "general", str(text), "--model", "debug:bert", "--out", str(out),
            "--general-gradients", "off", "--save-maps", "-q"]
    for _ in range(2):
        assert main(argv) == 0, capsys.readouterr().err
        store = open_store(out / "maps" / "general")
        assert store.complete and len(store) == 2
    shutil.rmtree(out / "maps" / "general")
    (out / "maps" / "general").mkdir()
    (out / "maps" / "general" / "notes.txt").write_text("mine")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    # the folder, what is wrong with it (not a store), and the flag that chose it
    says(one_line(err), f"error: {out / 'maps' / 'general'}: ", "not attnscope stores", "--save-maps")
    assert [p.name for p in (out / "maps" / "general").iterdir()] == ["notes.txt"]


def test_fit_head_has_one_spelling():
    """--fit-mlm-head and --general-gradients fit-head were one switch spelled twice (with
    --attribution-fit-head a third time): general keeps its --general-gradients choice, and
    attribution's switch is the only other flag that names it."""
    from attnscope.families.general import GeneralOptions
    from attnscope.pipeline import RunConfig

    names = set()
    for _, command in _commands(build_command()):
        for param in _options(command):
            kind = _value_kind(param)
            names |= {o for o in param.opts if "fit" in o}
            names |= {f"{o} {c}" for o in param.opts for c in kind[1] if "fit" in c}
    assert names == {"--general-gradients fit-head", "--attribution-fit-head"}
    assert "fit_mlm_head" not in {f.name for f in dataclasses.fields(GeneralOptions)}
    assert RunConfig(gradients="fit-head").options["general"].gradient_mode == "fit-head"
    with pytest.raises(AttnscopeError) as e:
        RunConfig(fit_mlm_head=True)
    says(one_line(e.value), "unknown", "fit_mlm_head", "gradients")  # the argument, and the known ones


def test_the_old_spelling_is_a_usage_error(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat .\n")
    assert main(["run", "--text", str(text), "--fit-mlm-head", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ")
    says(one_line(err), "No such option", "--fit-mlm-head")
    assert not (tmp_path / "o").exists()


# -- errors: the library names parameters, the command line its flags ----------------------------
def test_for_flags_leaves_paths_brackets_quotes_and_file_names_alone():
    flags = {"out_dir": "--out", "ray": "--ray", "model": "--model"}
    cases = [
        ("out_dir: already holds other files (choose another out_dir)", ("out_dir",),
         "out_dir: already holds other files (choose another --out)"),
        ("runs/model: holds other files (give model)", ("model",), "runs/model: holds other files (give --model)"),
        ("model.json: give model", ("model",), "model.json: give --model"),
        ("ray needs Ray, which is not installed: pip install 'attnscope[ray]'", ("ray",),
         "--ray needs Ray, which is not installed: pip install 'attnscope[ray]'"),
        ("a 'model' value, not model", ("model",), "a 'model' value, not --model"),
    ]
    for message, params, shown in cases:
        assert AttnscopeError(message, params=params).for_flags(flags) == shown


def _library_cases(tmp_path):
    """(a library call, its message naming parameters, a command line reaching the same check,
    the line that command prints naming its flags)."""
    from attnscope.compare import compare
    from attnscope.jobs import extract_to_store
    from attnscope.models.loading import resolve_device
    from attnscope.on_ray import check_ray

    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat .\nthe dog ran .\n")
    examples = tmp_path / "ex.json"
    examples.write_text('[{"text": "the cat sat on the mat ."}]')
    store = tmp_path / "store"
    assert main(["extract", str(examples), "--model", "debug:bert", "--out", str(store), "-q"]) == 0
    return [
        (lambda: resolve_device("gpu"), "device gpu: not one of cpu, auto, cuda, cuda:N, mps",
         ["run", "--text", str(text), "--model", "debug:bert", "--device", "gpu", "--out", str(tmp_path / "o")],
         "error: --device gpu: not one of cpu, auto, cuda, cuda:N, mps"),
        (lambda: check_ray(False, 2), "workers needs ray",
         ["analyze", "general", str(text), "--model", "debug:bert", "--workers", "2", "--out", str(tmp_path / "o")],
         "error: --workers needs --ray"),
        (lambda: extract_to_store([], store, "debug:bert"),
         f"{store}: already holds a store (use resume to continue it or overwrite to replace it)",
         ["extract", str(examples), "--model", "debug:bert", "--out", str(store)],
         f"error: {store}: already holds a store (use --resume to continue it or --overwrite to replace it)"),
        (lambda: compare(store, store, tmp_path / "c", n_boot=50), "n_boot must be at least 100, not 50",
         ["compare", str(store), str(store), "--n-boot", "50", "--out", str(tmp_path / "c")],
         "error: --n-boot must be at least 100, not 50"),
    ]


def test_errors_name_parameters_in_the_library_and_flags_on_the_command_line(tmp_path, capsys):
    for call, library, argv, shown in _library_cases(tmp_path):
        with pytest.raises(AttnscopeError) as refused:
            call()
        assert str(refused.value) == library
        assert not any(w.startswith("--") for w in library.split())
        capsys.readouterr()
        assert main(argv) == 2
        assert capsys.readouterr().err.strip() == shown
    assert not (tmp_path / "o").exists() and not (tmp_path / "c").exists()


def test_view_sets_its_options_out_in_named_groups(capsys):
    # 24 options in one list before (issue 57): now under what they are for, every one once
    assert main(["view", "--help"]) == 0
    out = capsys.readouterr().out
    sections = {}
    current = None
    for line in out.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
            sections[current] = []
        elif current and line.startswith("  -"):  # an option's own line (not its help's)
            sections[current].append(line.split()[0].rstrip(","))
    assert list(sections) == ["Arguments", "Options", "What to draw", "Running the model", "PNG and SVG",
                              "Long inputs", "Head pages and long documents"], list(sections)
    assert {"-e", "--layer", "--heads", "--head", "--kind"} <= set(sections["What to draw"])
    assert "--png" in sections["PNG and SVG"] and "--generate" in sections["Running the model"]
    assert "--max-seq-len" in sections["Head pages and long documents"]
    flags = [f for fs in sections.values() for f in fs]
    assert len(flags) == len(set(flags))  # each option in one group
