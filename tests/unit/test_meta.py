"""Meta-tests that keep docs, config and CI from drifting away from the code."""
from __future__ import annotations

import re
import subprocess

import click
import pytest

from reinf.catalog import PROJECT_ROOT
from reinf.cli import main
from reinf.config import settings

README = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
CONFIG_YAML = (PROJECT_ROOT / "config.yaml").read_text(encoding="utf-8")


def all_commands(group: click.Group, prefix: str = "reinf"):
    for name, cmd in sorted(group.commands.items()):
        yield f"{prefix} {name}", cmd
        if isinstance(cmd, click.Group):
            yield from all_commands(cmd, f"{prefix} {name}")


def test_every_cli_command_appears_in_the_readme():
    for path, cmd in all_commands(main):
        words = path.split()
        if isinstance(cmd, click.Group) and len(words) == 2 and cmd.commands:
            continue  # a group is documented through its subcommands
        assert f"`{path}" in README, f"`{path}` is not documented in README.md"


def test_every_config_key_appears_in_config_yaml():
    for s in settings():
        assert re.search(rf"^  {re.escape(s.key)}: .+  # .+$", CONFIG_YAML, re.M), s.public


def test_promised_keys_are_documented_in_the_readme():
    promised = ["model_path", "max_history", "learning_rate", "batch_size", "ppo_clip",
                "train_interval_minutes", "train_after_ratings", "reward_mapper",
                "replay_buffer_size", "gradient_accumulation_steps", "device", "quantization",
                "lora.r", "lora.alpha", "lora.dropout", "lora.target_modules", "kl_coef",
                "temperature", "max_new_tokens", "host", "port", "data_dir", "db_url"]
    public = {s.public for s in settings()}
    for key in promised:
        assert key in public, f"promised key {key} is not a setting"
        assert f"`{key}`" in README, f"promised key {key} is not in README.md"


def test_ci_runs_the_readme_test_command():
    script = (PROJECT_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "test-command" in script
    out = subprocess.run(
        ["bash", "-c", "sed -n '/<!-- test-command -->/,/<!-- \\/test-command -->/p' README.md"
         " | sed -n '/^```sh/,/^```$/p' | sed '1d;$d'"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert "pytest" in out and "torch==2.13.0" in out
    # torch is pinned before anything that depends on it, so CI never pulls CUDA wheels
    assert out.index("torch==2.13.0") < out.index("-e")


def _imports(path) -> set[str]:
    """Every module a source file imports, at any depth (lazy imports inside functions too)."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


# What constraints-min.txt pins, plus the tests' own builders of tiny models and tokenizers
# (tests/tiny.py) and the model loader.
ML_STACK = ("transformers", "tokenizers", "peft", "trl", "huggingface_hub", "accelerate",
            "datasets", "safetensors", "tiny", "reinf.model.modeling.load_model")


def test_unit_tests_that_reach_the_ml_stack_run_on_its_minimum_versions():
    """CI runs only the tests marked `stack` again on constraints-min.txt. A unit test file
    that imports the stack, a tiny-model builder or the model loader must carry the mark.

    Reinf imports the stack lazily, so a test can also reach it through Reinf's own code
    without importing it. The marks were set from a per-test measurement, which is how to
    check them again (pytest-cov; source_pkgs = the packages above in a .coveragerc):
    `python -m pytest tests/unit --cov --cov-config=RC --cov-context=test`, then list the
    coverage database's contexts that hold lines of those packages."""
    script = (PROJECT_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "-m stack" in script
    unmarked = []
    for path in sorted((PROJECT_ROOT / "tests" / "unit").glob("test_*.py")):
        reaches = any(name == root or name.startswith(root + ".")
                      for name in _imports(path) for root in ML_STACK)
        if reaches and "pytest.mark.stack" not in path.read_text(encoding="utf-8"):
            unmarked.append(path.name)
    assert not unmarked, f"add `pytestmark = pytest.mark.stack` to {unmarked}"


def test_the_core_never_imports_the_benchmarks():
    """reinf.bench is measuring tooling: only `reinf bench` (cli/bench.py) may reach it, so
    the product core, the trainer, the demo build and the web app never depend on it."""
    core = [p for p in sorted((PROJECT_ROOT / "reinf").rglob("*.py"))
            if "bench" not in p.relative_to(PROJECT_ROOT / "reinf").parts
            and p != PROJECT_ROOT / "reinf" / "cli" / "bench.py"]
    core += sorted((PROJECT_ROOT / "webui").rglob("*.py"))
    assert len(core) > 30, "the walk found too few modules to mean anything"
    offenders = {str(p.relative_to(PROJECT_ROOT)): sorted(n for n in _imports(p)
                                                         if n.startswith("reinf.bench"))
                 for p in core}
    assert not {k: v for k, v in offenders.items() if v}


def test_the_core_never_imports_the_web_app():
    """Only `reinf serve` (cli/serve.py) starts the web app; nothing else in reinf reaches it."""
    core = sorted((PROJECT_ROOT / "reinf").rglob("*.py"))
    core = [p for p in core if "bench" not in p.relative_to(PROJECT_ROOT / "reinf").parts
            and p != PROJECT_ROOT / "reinf" / "cli" / "serve.py"]
    offenders = {str(p.relative_to(PROJECT_ROOT)): sorted(n for n in _imports(p)
                                                         if n == "webui" or n.startswith("webui."))
                 for p in core}
    assert not {k: v for k, v in offenders.items() if v}


def test_every_referenced_doc_exists():
    """Error messages, docstrings, pages and the README point at docs/*.md that are there."""
    sources = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
    for folder in ("reinf", "webui"):
        sources += [p for p in sorted((PROJECT_ROOT / folder).rglob("*"))
                    if p.suffix in (".py", ".js", ".html") and "__pycache__" not in p.parts]
    referenced = {}
    for path in sources:
        for ref in re.findall(r"docs/[\w./-]+?\.md\b", path.read_text(encoding="utf-8")):
            referenced.setdefault(ref, path.relative_to(PROJECT_ROOT))
    assert "docs/api.md" in referenced  # the scan finds what it is for
    missing = {ref: str(where) for ref, where in referenced.items()
               if not (PROJECT_ROOT / ref).is_file()}
    assert not missing, f"referenced but missing: {missing}"


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces
    to hyphens, a repeated heading numbered (``-1``, ``-2``)."""
    out, seen = set(), {}
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)  # no headings in code
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_link_to_a_heading_finds_it():
    """Links to a section (``#anchor``, ``page.md#anchor``) in the README and docs/*.md
    name a heading that is there, so a renamed section cannot leave a dead link behind."""
    pages = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
    anchors = {p.resolve(): _anchors(p.read_text(encoding="utf-8")) for p in pages}
    links, dead = 0, []
    for page in pages:
        for target, anchor in re.findall(r"\]\(([\w./-]*?)#([\w-]+)\)",
                                          page.read_text(encoding="utf-8")):
            goal = (page.parent / target).resolve() if target else page.resolve()
            if goal in anchors:
                links += 1
                if anchor not in anchors[goal]:
                    dead.append(f"{page.name}: {target}#{anchor}")
    assert links > 20  # the scan finds what it is for
    assert not dead, f"links to headings that are not there: {dead}"


# Built from pieces so that this file does not match itself.
OUTSIDE_DESIGN_REFS = ("DESIGN" + ".md", "DESIGN" + " §", ".." + "/shared", "/work" + "/shared")


def _repository_text_files():
    """Tracked files, and new ones git does not ignore, of the kinds that hold prose."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=PROJECT_ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    suffixes = (".py", ".md", ".html", ".js", ".yaml", ".toml")
    return [name for name in out.splitlines()
            if name.endswith(suffixes) and (PROJECT_ROOT / name).is_file()]


def test_the_project_never_points_at_an_outside_design_note():
    """The design lives in docs/design.md; nothing cites a file outside the repository."""
    files = _repository_text_files()
    assert "README.md" in files and "reinf/config.py" in files  # the listing means something
    offenders = []
    for name in files:
        text = (PROJECT_ROOT / name).read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if any(ref in line for ref in OUTSIDE_DESIGN_REFS):
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert not offenders, "cite docs/design.md §N instead:\n" + "\n".join(offenders)


def test_the_design_page_exists_and_the_readme_links_it():
    design = PROJECT_ROOT / "docs" / "design.md"
    assert design.is_file(), "docs/design.md is missing"
    assert "](docs/design.md)" in README, "README.md does not link docs/design.md"
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", design.read_text(encoding="utf-8"),
                                           re.M)}
    assert sections == set(range(1, 11)), f"docs/design.md sections: {sorted(sections)}"
    cited = {}
    for name in _repository_text_files():
        text = (PROJECT_ROOT / name).read_text(encoding="utf-8", errors="replace")
        for n in re.findall(r"docs/design\.md §(\d+)", text):
            cited.setdefault(int(n), name)
    assert cited, "nothing cites docs/design.md §N: the scan finds nothing"
    assert not {n: name for n, name in cited.items() if n not in sections}, \
        f"cited sections missing from docs/design.md: {cited}"


# The packages of reinf from the top down (docs/architecture.md, "Layers"): each imports only
# what is below it. The top-level modules (config, catalog, errors, records, logs) are the floor.
LAYERS = ["cli", "bench", "demo", "webui", "client", "daemon", "serving", "training", "storage",
          "rewards", "model", "floor"]


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "webui":
        return "webui"
    name = parts[1] if len(parts) > 1 else ""
    if name == "__main__":      # `python -m reinf` is the command line
        return "cli"
    return name if name in LAYERS else "floor"


def test_the_packages_import_only_downwards():
    files = [*sorted((PROJECT_ROOT / "reinf").rglob("*.py")),
             *sorted((PROJECT_ROOT / "webui").rglob("*.py"))]
    seen, upward = set(), {}
    for path in files:
        rel = path.relative_to(PROJECT_ROOT).with_suffix("")
        own = _layer(".".join(rel.parts))
        seen.add(own)
        for name in _imports(path):
            if not (name.startswith("reinf.") or name.startswith("webui")):
                continue
            target = _layer(name)
            if target != own and LAYERS.index(target) < LAYERS.index(own):
                upward.setdefault(str(rel), []).append(name)
    assert seen == set(LAYERS), "every layer has modules (the walk found them all)"
    assert not upward, upward


def test_the_module_map_names_every_module():
    """docs/architecture.md's tree names every module of reinf/ (cli/ is described as a
    whole: one module per area of commands)."""
    text = (PROJECT_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    modules = [p for p in sorted((PROJECT_ROOT / "reinf").rglob("*.py"))
               if p.name not in ("__init__.py", "__main__.py")
               and p.parent.name not in ("cli", "__pycache__")]
    assert len(modules) > 50
    assert not [str(p.relative_to(PROJECT_ROOT)) for p in modules if f" {p.name} " not in text]
