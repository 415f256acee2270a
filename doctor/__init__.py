"""`specexport doctor`: what this machine has for the GPU paths (versions and a verdict each), and whether the
GPU paths give the CPU runtime's tokens, on a tiny random Llama and on a given bundle.

The check logic lives here, not in the CLI: `specexport doctor` only parses options and prints,
`tests/test_tensorrt_gpu.py` and `samples/jetson` call the same functions.

    probes.py   the version probes and their verdicts (a `System` reads the machine; tests pass a double)
    tiny.py     the tiny random Llama (and a noisy drafter of it), as tests/conftest.py builds it
    checks.py   token identity per mode and backend, engine builds, each check timed
    report.py   doctor.json, doctor.md and the exit code
"""
