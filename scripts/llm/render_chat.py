#!/usr/bin/env python3
"""Render chat messages through a chat template as Hugging Face's
apply_chat_template does (jinja2's sandbox, trim_blocks and lstrip_blocks,
raise_exception, the assistant's turn opened): the reference the GGUF
tests hold Tessera's chat prompts to.

    render_chat.py TEMPLATE_FILE BOS EOS < messages.json   (prints the text as JSON)
"""

import json
import sys
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    template, bos, eos = sys.argv[1:]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    messages = json.load(sys.stdin)
    text = env.from_string(open(template).read()).render(
        messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos)
    print(json.dumps(text))


if __name__ == "__main__":
    main()
