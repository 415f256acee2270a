"""The runtime runs without torch, transformers or onnx; the sample app embeds it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BLOCKER = textwrap.dedent("""
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"torch", "transformers", "onnx", "optimum", "tensorrt"}:
                raise ImportError(f"blocked for this test: {name}")
    sys.meta_path.insert(0, Block())
""")


def test_runtime_imports_and_generates_without_torch(tiny_bundles):
    bundle = tiny_bundles("ort", 2)
    code = BLOCKER + textwrap.dedent(f"""
        from specexport.runtime import load
        session = load({str(bundle)!r})
        out = session.generate("hash table", max_new_tokens=5)
        assert out.stats.new_tokens == len(out.tokens) > 0, out
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {{"torch", "transformers", "onnx"}})
        assert not heavy, heavy
        print("ok", len(out.tokens))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")


def test_cli_generate_without_torch(tiny_bundles):
    bundle = tiny_bundles("ort", 2)
    code = BLOCKER + "from specexport.cli.main import main; main()"
    proc = subprocess.run([sys.executable, "-c", code, "generate", "--bundle", str(bundle), "--max-new-tokens",
                           "4", "fox"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "tokens/s" in proc.stderr


def test_sample_chat_app_streams(tiny_bundles):
    bundle = tiny_bundles("ort", 2)
    proc = subprocess.run([sys.executable, str(REPO / "samples" / "chat_app.py"), str(bundle), "-"],
                          input="hash table\nthe quick brown fox\n", capture_output=True, text=True,
                          timeout=300, env={**os.environ})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("tokens/s") == 2


def test_sample_tune_draft_length_runs(tiny_bundles):
    """The eta/gamma sweep sample checks losslessness as it goes and prints one row per setting."""
    import subprocess
    import sys
    from pathlib import Path

    bundle = tiny_bundles("ort", 2, adapter="untrained")
    script = Path(__file__).resolve().parents[1] / "samples" / "tune_draft_length.py"
    out = subprocess.run([sys.executable, str(script), str(bundle), "--eta", "0.0,0.5", "--gamma", "2",
                          "--limit", "2", "--max-new-tokens", "8", "--threads", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()[1:]]
    assert [r[:2] for r in rows] == [["0.0", "2"], ["0.5", "2"]]
    assert all(float(r[2]) >= 1.0 for r in rows)  # tau counts the target's own token


def test_generate_returns_the_text_a_stream_of_the_same_request_shows(tiny_bundles):
    from specexport.runtime import load

    session = load(tiny_bundles("ort", 2))
    for prompt in ("Explain how a hash table works.", "write a haiku about the sea"):
        for options in ({"mode": "ar"}, {"mode": "lookup"}, {"mode": "ar", "stop": ["e"]}):
            stream = session.stream(prompt, max_new_tokens=24, **options)
            streamed = "".join(stream)
            whole = session.generate(prompt, max_new_tokens=24, **options)
            assert whole.text == streamed and whole.finish_reason == stream.finish_reason, (prompt, options)
            assert whole.tokens == stream.generation().tokens
