"""Meta-tests that keep docs, config and CI from drifting away from the code."""
from __future__ import annotations

import re
import subprocess

import click

from reinf.cli import main
from reinf.config import PROJECT_ROOT, settings

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
