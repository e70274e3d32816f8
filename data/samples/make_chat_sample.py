#!/usr/bin/env python3
"""data/samples/make_chat_sample.py — generates data/samples/chat_sample.jsonl, Loom's shipped
chat/instruction (SFT) sample: small synthetic tasks a small model can learn (sort numbers,
reverse words, add, count, repeat, spell, uppercase, find the largest), one conversation per line,
in both schemas prepare_data --format chat reads ({"messages": [...]} with and without a system
turn, some with two exchanges, and {"prompt": ..., "response": ...}).

Lengths are long-tailed like real SFT data: a task's size (list length, digits, words) is drawn
log-normal and capped, so most conversations are short and a few are long. Everything is
generated here (no dataset is copied). Deterministic: pure standard library, one seeded
random.Random, so the same script writes the same bytes.

    python3 data/samples/make_chat_sample.py            # rewrites data/samples/chat_sample.jsonl
    python3 data/samples/make_chat_sample.py --out F --count 3000 --seed 20241205
"""
import argparse
import json
import os
import random

WORDS = """
apple river stone cloud garden window yellow silver forest candle bridge rabbit pencil
orange castle winter summer ladder pepper bottle market island rocket jacket button carpet
dragon engine finger guitar hammer kitten lemon mirror needle ocean parrot pillow puzzle
rain shadow spoon tiger tunnel violin wagon whistle zebra anchor basket blanket camera
cherry cotton desert feather flower glove harbor helmet honey insect jungle kettle lantern
marble meadow monkey nest noodle paddle planet pocket pumpkin quilt saddle sailor spider
sugar table teapot thunder ticket tomato towel turtle valley velvet walnut wheel wizard
acorn badge barrel beetle bucket cactus canyon cookie copper crayon dolphin falcon fossil
garlic goose hazel igloo ivory jelly kayak koala lizard maple mitten nickel olive otter
pebble pirate poppy raven ribbon salmon scarf sponge squirrel tulip umbrella vase walrus
""".split()

SYSTEM_PROMPTS = [
    "You are a careful assistant. Answer with the result only.",
    "You follow instructions exactly and keep answers short.",
    "You are a helpful assistant that solves small text and number puzzles.",
]


def size(rng, mu, sigma, cap):
    """A long-tailed size: log-normal, at least 1, at most cap."""
    return max(1, min(cap, int(round(rng.lognormvariate(mu, sigma)))))


def numbers(rng, n):
    return [rng.randint(0, 999) for _ in range(n)]


def words(rng, n):
    return [rng.choice(WORDS) for _ in range(n)]


def task_sort(rng):
    xs = numbers(rng, size(rng, 1.6, 1.1, 256))
    ask = rng.choice(["Sort these numbers from smallest to largest: {}",
                      "Put these numbers in ascending order: {}"])
    return ask.format(" ".join(map(str, xs))), " ".join(map(str, sorted(xs)))


def task_reverse(rng):
    ws = words(rng, size(rng, 1.6, 1.1, 256))
    return ("Reverse the order of these words: " + " ".join(ws), " ".join(reversed(ws)))


def task_add(rng):
    a = rng.randint(0, 10 ** size(rng, 1.0, 0.8, 40) - 1)
    b = rng.randint(0, 10 ** size(rng, 1.0, 0.8, 40) - 1)
    ask = rng.choice(["What is {} + {}?", "Add {} and {}."])
    return ask.format(a, b), str(a + b)


def task_count(rng):
    ws = words(rng, size(rng, 1.5, 1.1, 200))
    return "How many words are in this list? " + ", ".join(ws), str(len(ws))


def task_repeat(rng):
    w, n = rng.choice(WORDS), size(rng, 1.3, 1.1, 200)
    return 'Repeat the word "{}" {} times.'.format(w, n), " ".join([w] * n)


def task_spell(rng):
    ws = words(rng, size(rng, 0.3, 0.8, 20))
    text = " ".join(ws)
    spelled = " / ".join("-".join(w) for w in ws)
    what = "the word" if len(ws) == 1 else "these words"
    return 'Spell {} "{}" letter by letter.'.format(what, text), spelled


def task_upper(rng):
    ws = words(rng, size(rng, 1.6, 1.1, 256))
    text = "the " + " ".join(ws)
    return "Write this in capital letters: " + text, text.upper()


def task_max(rng):
    xs = numbers(rng, size(rng, 1.6, 1.1, 256))
    return "Which is the largest of these numbers? " + " ".join(map(str, xs)), str(max(xs))


TASKS = [task_sort, task_reverse, task_add, task_count, task_repeat, task_spell, task_upper,
         task_max]


def conversation(rng):
    """One conversation in one of the schemas."""
    kind = rng.random()
    if kind < 0.45:
        prompt, response = rng.choice(TASKS)(rng)
        return {"prompt": prompt, "response": response}
    messages = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    for _ in range(2 if rng.random() < 0.15 else 1):
        prompt, response = rng.choice(TASKS)(rng)
        messages.append({"role": "user", "content": prompt})
        messages.append({"role": "assistant", "content": response})
    return {"messages": messages}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "chat_sample.jsonl"))
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=20241205)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for _ in range(args.count):
            f.write(json.dumps(conversation(rng)) + "\n")


if __name__ == "__main__":
    main()
