"""``implement`` tasks: implement a function from SPEC.md (the stub raises NotImplementedError)."""

from __future__ import annotations

import random
import string

from producers.fleet.tasks.base import TaskInstance, call_cases, family, ident, make_id, unit_tests

INSTRUCTION = "Implement `{func}` in {module}.py as described in SPEC.md. `python3 run_tests.py` runs the tests."


def _implement(
    name: str,
    seed: int,
    module: str,
    func: str,
    signature: str,
    spec: str,
    solution_body: str,
    wrong_body: str,
    cases: list,
) -> TaskInstance:
    path = f"{module}.py"
    head = f'def {func}({signature}):\n    """See SPEC.md."""\n'
    return TaskInstance(
        task_id=make_id(name, seed),
        task_type="implement",
        family=name,
        seed=seed,
        instruction=INSTRUCTION.format(func=func, module=module),
        files={
            path: head + "    raise NotImplementedError\n",
            "SPEC.md": f"# {func}\n\n{spec}\n",
            "tests/test_visible.py": unit_tests(module, func, cases[:3], "visible"),
        },
        hidden_tests={"test_hidden.py": unit_tests(module, func, cases, "hidden")},
        hidden_cases=call_cases(module, func, cases, "hidden"),
        deliverables=(path,),
        solution={path: head + solution_body},
        wrong_guess={path: head + wrong_body},
        config={"TL_TASK_FAMILY": name},
    )


def _word(rng: random.Random, alphabet: str, lo: int, hi: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


@family("implement.rle")
def rle(rng: random.Random, seed: int) -> TaskInstance:
    """Run-length encoding with a randomized output format."""
    module, func = ident(rng), "encode_" + ident(rng, 1)
    sep = rng.choice(["", "-", ":", "."])
    count_first = rng.random() < 0.5
    joiner = rng.choice([",", ";", "|"])
    item = "f'{n}" + sep + "{c}'" if count_first else "f'{c}" + sep + "{n}'"
    spec = (
        f"`{func}(text)` returns the run-length encoding of `text`: each maximal run of one character "
        f"becomes {'count' if count_first else 'character'}, then `{sep}`, then "
        f"{'character' if count_first else 'count'}; runs are joined with `{joiner}`. "
        "An empty text gives an empty string."
    )
    body = (
        "    runs = []\n    for ch in text:\n        if runs and runs[-1][0] == ch:\n            runs[-1][1] += 1\n"
        "        else:\n            runs.append([ch, 1])\n"
        f"    return {joiner!r}.join({item.replace('{n}', '{r[1]}').replace('{c}', '{r[0]}')} for r in runs)\n"
    )
    wrong = "    return ''.join(f'{len(text)}{text[:1]}') if text else ''\n"

    def reference(text: str) -> str:
        runs: list[list] = []
        for ch in text:
            if runs and runs[-1][0] == ch:
                runs[-1][1] += 1
            else:
                runs.append([ch, 1])
        return joiner.join(f"{n}{sep}{c}" if count_first else f"{c}{sep}{n}" for c, n in runs)

    cases = []
    for _ in range(7):
        text = "".join(rng.choice("abcxyz") * rng.randint(1, 5) for _ in range(rng.randint(2, 6)))
        cases.append(((text,), reference(text)))
    cases.append((("",), ""))
    return _implement("implement.rle", seed, module, func, "text", spec, body, wrong, cases)


@family("implement.rotate")
def rotate(rng: random.Random, seed: int) -> TaskInstance:
    """A rotation cipher over letters and digits with random shifts."""
    module, func = ident(rng), "rotate_" + ident(rng, 1)
    k, d = rng.randint(1, 25), rng.randint(1, 9)
    spec = (
        f"`{func}(text)` shifts every ASCII letter forward by {k} places in the alphabet (wrapping around, "
        f"keeping case) and every digit forward by {d} (mod 10). Other characters are unchanged."
    )
    body = (
        "    out = []\n    for ch in text:\n"
        f"        if 'a' <= ch <= 'z':\n            out.append(chr((ord(ch) - 97 + {k}) % 26 + 97))\n"
        f"        elif 'A' <= ch <= 'Z':\n            out.append(chr((ord(ch) - 65 + {k}) % 26 + 65))\n"
        f"        elif ch.isdigit():\n            out.append(str((int(ch) + {d}) % 10))\n"
        "        else:\n            out.append(ch)\n    return ''.join(out)\n"
    )
    wrong = f"    return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if c.islower() else c for c in text)\n"

    def reference(text: str) -> str:
        out = []
        for ch in text:
            if ch in string.ascii_lowercase:
                out.append(chr((ord(ch) - 97 + k) % 26 + 97))
            elif ch in string.ascii_uppercase:
                out.append(chr((ord(ch) - 65 + k) % 26 + 65))
            elif ch in string.digits:
                out.append(str((int(ch) + d) % 10))
            else:
                out.append(ch)
        return "".join(out)

    alphabet = string.ascii_letters + string.digits + " .,!-"
    cases = [((t,), reference(t)) for t in (_word(rng, alphabet, 5, 24) for _ in range(8))]
    return _implement("implement.rotate", seed, module, func, "text", spec, body, wrong, cases)


@family("implement.fizz")
def fizz(rng: random.Random, seed: int) -> TaskInstance:
    """FizzBuzz with random divisors and words."""
    module, func = ident(rng), ident(rng, 1) + "_sequence"
    a, b = rng.sample([2, 3, 4, 5, 6, 7], 2)
    w1, w2 = (w.capitalize() for w in rng.sample(["zip", "zap", "bop", "fizz", "buzz", "pling", "plong"], 2))
    spec = (
        f"`{func}(n)` returns a list of strings for 1..n: a multiple of both {a} and {b} gives `{w1}{w2}`, "
        f"of {a} only `{w1}`, of {b} only `{w2}`, otherwise the number itself as a string."
    )
    body = (
        "    out = []\n    for i in range(1, n + 1):\n"
        f"        word = ({w1!r} if i % {a} == 0 else '') + ({w2!r} if i % {b} == 0 else '')\n"
        "        out.append(word or str(i))\n    return out\n"
    )
    wrong = f"    return [{w1!r} if i % {a} == 0 else {w2!r} if i % {b} == 0 else str(i) for i in range(1, n + 1)]\n"

    def reference(n: int) -> list[str]:
        return [((w1 if i % a == 0 else "") + (w2 if i % b == 0 else "")) or str(i) for i in range(1, n + 1)]

    sizes = [a * b, rng.randint(1, 5)] + [rng.randint(a * b, 60) for _ in range(6)]
    return _implement(
        "implement.fizz", seed, module, func, "n", spec, body, wrong, [((n,), reference(n)) for n in sizes]
    )


@family("implement.duration")
def duration(rng: random.Random, seed: int) -> TaskInstance:
    """Parse a duration string with randomized unit letters."""
    module, func = ident(rng), "parse_" + ident(rng, 1)
    letters = rng.sample("bcdfgjkqvwxz", 3)
    units = dict(zip(letters, rng.sample([86400, 3600, 60, 1], 3), strict=True))
    spec = (
        f"`{func}(text)` parses a duration such as `3{letters[0]}12{letters[1]}` into seconds. The text is a "
        "sequence of <integer><unit> parts; units: "
        + ", ".join(f"`{u}` = {s} s" for u, s in units.items())
        + ". Sum all parts."
    )
    body = (
        f"    units = {units!r}\n    total, number = 0, ''\n    for ch in text:\n"
        "        if ch.isdigit():\n            number += ch\n        else:\n"
        "            total += int(number) * units[ch]\n            number = ''\n    return total\n"
    )
    wrong = "    import re\n    return sum(int(x) for x in re.findall(r'\\d+', text))\n"
    cases = []
    for _ in range(8):
        parts = rng.sample(letters, rng.randint(1, 3))
        amounts = [rng.randint(1, 99) for _ in parts]
        text = "".join(f"{n}{u}" for n, u in zip(amounts, parts, strict=True))
        cases.append(((text,), sum(n * units[u] for n, u in zip(amounts, parts, strict=True))))
    return _implement("implement.duration", seed, module, func, "text", spec, body, wrong, cases)
