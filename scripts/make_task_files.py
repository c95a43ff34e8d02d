#!/usr/bin/env python3
"""Writes the small task files under data/tasks/ that the repository generates itself
(the reasoning model's held-out problems, reasoning_eval.npz, come from the fixtures):

- reasoning_trace_ids.txt: one fresh synthetic reasoning trace (30 arithmetic steps,
  seed 2026, not one of reasoning_eval's problems) as whitespace-separated token ids
  of reasoning-bytes (bytes, BOS 256, <think> 257, </think> 258), in the format the
  model was trained on (data/SOURCES.md). What [data] token_file runs the model on,
  so that phase strategies find the </think> marker.
- revelation_cloze.jsonl: a cloze task for gpt2-bytes and llama-bytes over their
  held-out text (data/text/eval_kjv_revelation.txt): the prompt is the start of a verse
  (at least 60 characters), the answer the verse's next word.

Usage: scripts/make_task_files.py [REPO_ROOT]   (deterministic: reruns write the same files)
"""
import json
import random
import re
import sys
from pathlib import Path

BOS, THINK, END_THINK = 256, 257, 258


def reasoning_trace(rng, steps):
    value = rng.randint(2, 99)
    ops, lines, values = [], [], []
    start = value
    for _ in range(steps):
        # Values stay below 1000, as in reasoning_eval's problems (at most 896 there).
        choices = (["add"] if value < 900 else []) + (["subtract"] if value > 2 else [])
        choices += (["double"] if value < 500 else []) + (["halve"] if value % 2 == 0 else [])
        op = rng.choice(choices)
        if op == "add":
            n = rng.randint(2, min(99, 999 - value))
            ops.append(f"add {n}")
            lines.append(f"{value}+{n}={value + n}.")
            value += n
        elif op == "subtract":
            n = rng.randint(2, min(98, value))
            ops.append(f"subtract {n}")
            lines.append(f"{value}-{n}={value - n}.")
            value -= n
        elif op == "double":
            ops.append("double")
            lines.append(f"{value}*2={value * 2}.")
            value *= 2
        else:
            ops.append("halve")
            lines.append(f"{value}/2={value // 2}.")
            value //= 2
        values.append(value)
    question = f"Q: Start with {start}. Then {', '.join(ops)}. What are the values along the way?\n"
    answer = f"\nA: The values are {', '.join(map(str, values))}. The final value is {value}.\n"
    return [BOS] + list(question.encode()) + [THINK] + list(" ".join(lines).encode()) + [END_THINK] + list(answer.encode())


def cloze(text, count, rng):
    verses = [m.group(1).strip() for m in re.finditer(r"^\s*\d+ (.+)$", text, re.M)]
    rng.shuffle(verses)
    items = []
    for verse in verses:
        words = list(re.finditer(r"[A-Za-z]+", verse))
        cut = [w for w in words if w.start() >= 60 and len(w.group()) >= 4]
        if not cut:
            continue
        w = cut[0]
        items.append({"prompt": verse[: w.start()], "answer": w.group()})
        if len(items) == count:
            break
    return items


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    tasks = root / "data" / "tasks"
    trace = reasoning_trace(random.Random(2026), 30)
    (tasks / "reasoning_trace_ids.txt").write_text(" ".join(map(str, trace)) + "\n")
    text = (root / "data" / "text" / "eval_kjv_revelation.txt").read_text()
    with open(tasks / "revelation_cloze.jsonl", "w") as f:
        for item in cloze(text, 24, random.Random(19)):
            f.write(json.dumps(item) + "\n")


if __name__ == "__main__":
    main()
