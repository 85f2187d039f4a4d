"""guidellm's OpenAI HTTP backend (its real code, as `guidellm benchmark`
runs it) against a Tessera front door: its default backend validation
(`GET /health`), the default model (the first of `/v1/models`) and one
streamed chat request through its own request handler, whose usage it
reads from the stream's last chunk.

    guidellm_test.py TARGET MODEL

TARGET is the front door's root URL; MODEL the generative model it
serves. Exits non-zero on the first failure.
"""

import asyncio
import sys

from guidellm.backends.openai.http import OpenAIHTTPBackend
from guidellm.schemas import GenerationRequest, RequestInfo
from guidellm.schemas.backends import OpenAIHTTPBackendArgs


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok' if ok else 'FAIL'}: {name} {detail}")
    if not ok:
        sys.exit(1)


async def main() -> None:
    target, model = sys.argv[1], sys.argv[2]
    backend = OpenAIHTTPBackend(OpenAIHTTPBackendArgs(target=target, max_tokens=8))
    await backend.process_startup()
    try:
        await backend.validate()
        check("guidellm's default backend validation passes", True)
    except RuntimeError as e:
        check("guidellm's default backend validation passes", False, repr(e.__cause__))
    default = await backend.default_model()
    check("guidellm's default model is the one served", default == model, repr(default))

    request = GenerationRequest(columns={"text_column": ["What is the capital of France?"]})
    last = None
    async for response, _info in backend.resolve(request, RequestInfo()):
        if response is not None:
            last = response
    check("a streamed chat through guidellm's handler answers", last is not None and bool(last.text),
          repr(last))
    out = last.output_metrics
    check("guidellm reads the usage it counts", out.text_tokens is not None
          and 0 < out.text_tokens <= 8 and (last.input_metrics.text_tokens or 0) > 0,
          f"{last.input_metrics!r} {out!r}")
    await backend.process_shutdown()


if __name__ == "__main__":
    asyncio.run(main())
