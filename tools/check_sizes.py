#!/usr/bin/env python3
"""The house's size rules (issue 53), checked: no file in fs/, cache/ or tools/ over 500 lines and
no function body there over 80 lines (signature to closing brace).

    tools/check_sizes.py [FILE...]     default: the C++ files git knows under fs/, cache/, tools/

One line per file or function over its limit, exit 1; nothing and exit 0 when all hold. A
function is a brace block at namespace or class level whose opening brace follows a parameter
list's ')' (with qualifiers, a trailing return type, a constructor's initialisers or clang's
thread-safety attributes between them); lambdas and blocks inside a function count toward it.
Comments, strings and character literals are blanked first, so braces in them do not count.
"""
import re
import subprocess
import sys

MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
LIMITED_FILES = r"^(fs|cache|tools)/.*\.(cc|h|sh|py)$"
CXX = r"\.(cc|h)$"


def blank(src):
    """src with comments, string and char literals emptied; newlines kept (line numbers hold)."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * src.count("\n", i, j))
            i = j
            continue
        raw = re.match(r'R"([^(\s]*)\(', src[i : i + 20])
        if raw and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            end = ")" + raw.group(1) + '"'
            j = src.find(end, i)
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j
            continue
        c = src[i]
        # A quote, but not a digit separator (1'000'000).
        if c == '"' or (c == "'" and not (i > 0 and src[i - 1].isalnum() and src[i - 1] not in "uUL")):
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


CONTROL = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignas"}
QUALIFIERS = re.compile(
    r"\)(\s|const\b|override\b|final\b|noexcept\b|mutable\b|ACCELFS_\w+\([^()]*\)|->\s*[\w:<>,\s*&]+)*$")


def opens_function(text):
    """(name, where the name starts in `text`) of the function whose body the '{' after `text`
    opens, or None."""
    m = QUALIFIERS.search(text)
    if not m:
        return None
    depth, j = 0, m.start()
    for q in range(m.start(), -1, -1):  # the '(' that matches the last ')'
        if text[q] == ")":
            depth += 1
        elif text[q] == "(":
            depth -= 1
            if depth == 0:
                j = q
                break
    word = re.search(r"([\w~]+)\s*(<[^<>]*>)?\s*$", text[:j])
    if not word or word.group(1) in CONTROL:
        return None
    return word.group(1), word.start(1)


def long_functions(path):
    src = blank(open(path, encoding="utf-8").read())
    stack = []  # (name or None, first line); name only for a function body
    line = 1
    for i, c in enumerate(src):
        if c == "\n":
            line += 1
        elif c == "{":
            head = src[max(0, i - 400) : i]
            found = None if any(name for name, _ in stack) else opens_function(head.rstrip())
            if found:  # counted from the line of the function's name
                stack.append((found[0], line - head.count("\n", found[1])))
            else:
                stack.append((None, line))
        elif c == "}" and stack:
            name, first = stack.pop()
            if name and line - first + 1 > MAX_FUNCTION_LINES:
                yield f"{path}:{first}: {name} is {line - first + 1} lines (at most {MAX_FUNCTION_LINES})"


def main(argv):
    files = argv[1:]
    if not files:
        files = subprocess.run(["git", "ls-files", "fs", "cache", "tools"], check=True,
                               capture_output=True, text=True).stdout.split()
    problems = []
    for f in files:
        if not re.search(LIMITED_FILES, f):
            continue
        with open(f, encoding="utf-8") as fh:
            n = sum(1 for _ in fh)
        if n > MAX_FILE_LINES:
            problems.append(f"{f}: {n} lines (at most {MAX_FILE_LINES})")
        if re.search(CXX, f):
            problems.extend(long_functions(f))
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
