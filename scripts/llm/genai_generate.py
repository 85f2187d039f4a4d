"""The oracle for Tessera's generation: onnxruntime-genai's greedy text.

    genai_generate.py FOLDER --max-new N [--threads T] [--chat] PROMPT...
    genai_generate.py FOLDER --max-new N [--threads T] --batch B PROMPT...

prints one JSON object per prompt: the prompt, the generated token ids (the
end-of-sequence token left out, as Tessera leaves it out), their text, and
the tokens per second of the decode after the first token. With --batch,
the prompts (repeated to B) run as one batch of B sequences, and one
object gives the batch's tokens per second after the first token (all
sequences together, none stopping early).
"""

import argparse
import json
import time

import onnxruntime_genai as og


def load(folder: str, threads: int) -> og.Model:
    config = og.Config(folder)
    if threads > 0:
        options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
        config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    return og.Model(config)


def greedy(model: og.Model, ids: list[int], new_tokens: int, eos: set[int]) -> tuple[list[int], float, float]:
    """New token ids, seconds to the first, seconds for the rest."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    started = time.perf_counter()
    generator.append_tokens(ids)
    out: list[int] = []
    first = 0.0
    while not generator.is_done():
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        if not out:
            first = time.perf_counter() - started
        if token in eos:
            break
        out.append(token)
    return out, first, time.perf_counter() - started - first


def batched(model: og.Model, tokenizer, prompts: list[str], batch: int, new_tokens: int) -> dict:
    """Tokens/s of `batch` sequences generated as one batch."""
    texts = [prompts[i % len(prompts)] for i in range(batch)]
    params = og.GeneratorParams(model)
    longest = max(len(tokenizer.encode(t)) for t in texts)
    params.set_search_options(max_length=longest + new_tokens, do_sample=False, batch_size=batch)
    generator = og.Generator(model, params)
    started = time.perf_counter()
    generator.append_tokens(tokenizer.encode_batch(texts))
    generator.generate_next_token()
    first = time.perf_counter() - started
    steps = 1
    while not generator.is_done() and steps < new_tokens:
        generator.generate_next_token()
        steps += 1
    rest = time.perf_counter() - started - first
    rate = (steps - 1) * batch / rest if steps > 1 and rest > 0 else 0.0
    return {"batch": batch, "first_token_s": first, "tokens_per_s": rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("prompts", nargs="+")
    parser.add_argument("--max-new", type=int, required=True)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--chat", action="store_true")
    parser.add_argument("--batch", type=int, default=0)
    args = parser.parse_args()
    model = load(args.folder, args.threads)
    tokenizer = og.Tokenizer(model)
    if args.batch > 0:
        print(json.dumps(batched(model, tokenizer, args.prompts, args.batch, args.max_new)))
        return
    with open(f"{args.folder}/genai_config.json") as f:
        eos = f"{json.load(f)['model']['eos_token_id']}"
    eos_ids = {int(t) for t in eos.strip("[]").split(",")}
    for prompt in args.prompts:
        text = prompt
        if args.chat:
            messages = json.dumps([{"role": "user", "content": prompt}])
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = [int(t) for t in tokenizer.encode(text)]
        out, first, rest = greedy(model, ids, args.max_new, eos_ids)
        rate = (len(out) - 1) / rest if len(out) > 1 and rest > 0 else 0.0
        print(json.dumps({
            "prompt": prompt,
            "prompt_ids": ids,
            "ids": out,
            "text": tokenizer.decode(out),
            "first_token_s": first,
            "tokens_per_s": rate,
        }))


if __name__ == "__main__":
    main()
