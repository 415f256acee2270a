"""specexport serve: an OpenAI-compatible HTTP server over one runtime Session (Starlette + uvicorn, the `serve`
extra). It imports the runtime and nothing else of specexport.

    from specexport.serve import create_app, run
    run("bundles/smollm2", host="127.0.0.1", port=8000)
"""

from .app import create_app
from .server import run

__all__ = ["create_app", "run"]
