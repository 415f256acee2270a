"""A minimal app embedding the specexport runtime: load a bundle once, stream chat turns.

    python samples/chat_app.py bundles/smollm2 "Explain how a hash table works."
    echo "Name three rivers." | python samples/chat_app.py bundles/smollm2 -

Needs only the base install (numpy, onnxruntime, tokenizers): no torch.
"""

from __future__ import annotations

import sys

from specexport.runtime import load


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    session = load(argv[0])
    prompts = [line.strip() for line in sys.stdin if line.strip()] if argv[1] == "-" else argv[1:]
    for prompt in prompts:
        request = session.stream(prompt, max_new_tokens=64)
        for text in request:
            print(text, end="", flush=True)
        print()
        print(request.stats.summary(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
