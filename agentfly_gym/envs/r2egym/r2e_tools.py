"""The R2E-Gym agent tools, run INSIDE the task container (``python3 r2e_tools.py <payload>``).

This file is copied into each container at reset and executed there, so the tools behave
the same on every backend (Docker, the bubblewrap sandbox).  It uses only the standard
library and Python 3.6+ syntax, because task images bring their own interpreter.

Payload: one JSON object ``{"tool": "file_editor"|"search", "args": {...}}``, given as a
base64 command-line argument or, with ``--file PATH``, in a file.  The result is printed
to stdout; errors start with ``ERROR:`` and exit with status 0 (they are observations for
the agent, not crashes).

Semantics follow R2E-Gym's tools (``r2egym/agenthub/tools``): ``file_editor`` with
``view`` (``cat -n`` style; a directory lists non-hidden entries two levels deep),
``create`` (refuses to overwrite), ``str_replace`` (``old_str`` must occur exactly once),
``insert`` (after line ``insert_line``, 0 = top) and ``undo_edit`` (per-file history kept
in a state file); ``search`` (fixed-string search in a file, or per-file match counts in
a directory).  Unlike upstream, ``view`` also shows non-Python text files.
"""

# ruff: noqa: UP031  (%-formatting on purpose: this script runs under the task image's own, possibly old, python3)
import base64
import json
import os
import sys

STATE_FILE = os.environ.get("AFG_R2E_STATE", "/tmp/.afg_r2e/editor_state.json")
MAX_RESPONSE_LEN = 10000
SNIPPET_LINES = 4
TRUNCATED = ("<response clipped><NOTE>To save on context only part of this file has been shown to you. "
             "Use search or `grep -n` to find the line numbers you need, then view a range.</NOTE>")


class ToolError(Exception):
    pass


def clip(text, limit=MAX_RESPONSE_LEN):
    if len(text) <= limit:
        return text
    return text[:limit] + TRUNCATED


def numbered(text, start=1):
    lines = text.expandtabs().split("\n")
    return "\n".join("%6d\t%s" % (i + start, line) for i, line in enumerate(lines))


def load_history():
    try:
        with open(STATE_FILE, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def save_history(history):
    d = os.path.dirname(STATE_FILE)
    if d and not os.path.isdir(d):
        os.makedirs(d, exist_ok=True)
    with open(STATE_FILE, "w", encoding="utf-8") as f:
        json.dump(history, f)


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            return f.read()
    except OSError as e:
        raise ToolError("could not read %s: %s" % (path, e))


def write_text(path, text):
    try:
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    except OSError as e:
        raise ToolError("could not write %s: %s" % (path, e))


def list_dir(path):
    out = []
    base_depth = path.rstrip("/").count("/")
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        depth = root.rstrip("/").count("/") - base_depth
        out.append(root)
        if depth >= 2:
            dirs[:] = []
            continue
        for name in sorted(files):
            if not name.startswith("."):
                out.append(os.path.join(root, name))
        if depth >= 1:
            for d in dirs:
                out.append(os.path.join(root, d))
            dirs[:] = []
    return out


def editor(args, history):
    command = args.get("command")
    path = args.get("path", "")
    if not path.startswith("/"):
        raise ToolError("the path %r is not absolute; use e.g. /testbed/%s" % (path, path.lstrip("./")))
    if command == "create":
        if os.path.exists(path):
            raise ToolError("File already exists at: %s. Cannot overwrite with 'create'." % path)
    elif not os.path.exists(path):
        raise ToolError("The path '%s' does not exist." % path)
    if os.path.isdir(path) and command != "view":
        raise ToolError("The path '%s' is a directory. Only 'view' can be used on directories." % path)

    if command == "view":
        if os.path.isdir(path):
            if args.get("view_range"):
                raise ToolError("view_range is not allowed when path points to a directory.")
            return clip("Here's the files and directories up to 2 levels deep in %s, excluding hidden:\n%s"
                        % (path, "\n".join(list_dir(path))))
        text = read_text(path)
        lines = text.split("\n")
        if text.endswith("\n"):
            lines = lines[:-1]
        start, end = 1, len(lines)
        vr = args.get("view_range")
        if vr:
            start, end = int(vr[0]), int(vr[1])
            if not 1 <= start <= max(1, len(lines)):
                raise ToolError("Invalid view_range %s: start line must be in [1, %d]" % (vr, len(lines)))
            if end == -1:
                end = len(lines)
            elif end < start or end > len(lines):
                raise ToolError("Invalid view_range %s: end must be >= start and <= %d, or -1 to view until end."
                                % (vr, len(lines)))
        body = "\n".join("%6d %s" % (i, lines[i - 1].expandtabs()) for i in range(start, end + 1))
        return clip("Here's the result of running `cat -n` on %s:\n%s" % (path, body))

    if command == "create":
        if args.get("file_text") is None:
            raise ToolError("Parameter 'file_text' is required for command: create")
        parent = os.path.dirname(path)
        if parent and not os.path.isdir(parent):
            os.makedirs(parent, exist_ok=True)
        write_text(path, args["file_text"])
        history.setdefault(path, []).append(None)
        return "File created at %s. Here's the result of running `cat -n` on %s:\n%s\n" % (
            path, path, clip(numbered(args["file_text"])))

    if command == "str_replace":
        old = args.get("old_str")
        if old is None or old == "":
            raise ToolError("Parameter 'old_str' is required (and must not be empty) for command: str_replace")
        new = args.get("new_str") or ""
        text = read_text(path)
        n = text.count(old)
        if n == 0:
            raise ToolError("No replacement was performed, old_str `%s` did not appear verbatim in %s." % (old, path))
        if n > 1:
            where = [i + 1 for i, line in enumerate(text.split("\n")) if old.split("\n")[0] in line]
            raise ToolError("No replacement was performed. Multiple occurrences of old_str `%s` in lines %s. "
                            "Please ensure it is unique." % (old, where))
        updated = text.replace(old, new)
        history.setdefault(path, []).append(text)
        write_text(path, updated)
        line = text.split(old)[0].count("\n")
        s = max(0, line - SNIPPET_LINES)
        e = line + SNIPPET_LINES + new.count("\n")
        snippet = "\n".join(updated.split("\n")[s:e + 1])
        return ("The file %s has been edited. Here's the result of running `cat -n` on a snippet of %s:\n%s\n"
                "Review the changes and make sure they are as expected. Edit the file again if necessary."
                % (path, path, numbered(snippet, s + 1)))

    if command == "insert":
        new = args.get("new_str")
        if new is None:
            raise ToolError("Parameter 'new_str' is required for command: insert")
        at = args.get("insert_line")
        if at is None:
            raise ToolError("Parameter 'insert_line' is required for command: insert")
        text = read_text(path)
        lines = text.split("\n")
        n_lines = len(lines) - 1 if text.endswith("\n") else len(lines)
        if not 0 <= int(at) <= n_lines:
            raise ToolError("Invalid insert_line %s: it should be within the range of lines of the file: [0, %d]"
                            % (at, n_lines))
        at = int(at)
        new_lines = new.split("\n")
        updated = "\n".join(lines[:at] + new_lines + lines[at:])
        history.setdefault(path, []).append(text)
        write_text(path, updated)
        s = max(0, at - SNIPPET_LINES)
        snippet = "\n".join(lines[s:at] + new_lines + lines[at:at + SNIPPET_LINES])
        return ("The file %s has been edited. Here's the result of running `cat -n` on a snippet of the edited file:\n%s\n"
                "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, etc). "
                "Edit the file again if necessary." % (path, numbered(snippet, s + 1)))

    if command == "undo_edit":
        past = history.get(path) or []
        if not past:
            raise ToolError("No edit history found for %s." % path)
        previous = past.pop()
        if previous is None:  # the file was created by 'create': undo removes it
            os.remove(path)
            return "Last edit to %s undone successfully (the created file was removed)." % path
        write_text(path, previous)
        return "Last edit to %s undone successfully. Here's the result of running `cat -n` on %s:\n%s\n" % (
            path, path, clip(numbered(previous)))

    raise ToolError("Unrecognized command %r. The allowed commands for the file_editor tool are: "
                    "view, create, str_replace, insert, undo_edit" % (command,))


def is_binary(path):
    try:
        with open(path, "rb") as f:
            return b"\0" in f.read(4096)
    except OSError:
        return True


def search(args):
    term = args.get("search_term", "")
    path = args.get("path") or "."
    if not term:
        raise ToolError("Parameter 'search_term' must not be empty")
    if not os.path.exists(path):
        raise ToolError("Path '%s' not found or not a directory." % path)
    if os.path.isfile(path):
        hits = []
        for i, line in enumerate(read_text(path).split("\n"), 1):
            if term in line:
                hits.append("%d:%s" % (i, line))
        if not hits:
            return 'No matches found for "%s" in %s' % (term, path)
        return clip('Matches for "%s" in %s:\n%s' % (term, path, "\n".join(hits)))
    counts = []
    total = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in sorted(files):
            if name.startswith("."):
                continue
            fp = os.path.join(root, name)
            if is_binary(fp):
                continue
            try:
                with open(fp, encoding="utf-8", errors="replace") as f:
                    n = sum(line.count(term) > 0 for line in f)
            except OSError:
                continue
            if n:
                counts.append((fp, n))
                total += n
    if not counts:
        return 'No matches found for "%s" in %s' % (term, path)
    if len(counts) > 100:
        return ('More than %d files matched for "%s" in %s. Please narrow your search.' % (100, term, path))
    body = "\n".join("%s (%d matches)" % (fp, n) for fp, n in counts)
    return 'Found %d matches for "%s" in %s:\n%s\nEnd of matches for "%s" in %s' % (total, term, path, body, term, path)


def main(argv):
    try:
        if len(argv) >= 3 and argv[1] == "--file":
            with open(argv[2], encoding="utf-8") as f:
                payload = json.load(f)
        else:
            payload = json.loads(base64.b64decode(argv[1]).decode("utf-8"))
        tool = payload["tool"]
        args = payload.get("args", {})
    except (IndexError, KeyError, ValueError, OSError) as e:
        print("ERROR: bad tool payload: %s" % (e,))
        return 0
    try:
        if tool == "file_editor":
            history = load_history()
            out = editor(args, history)
            save_history(history)
        elif tool == "search":
            out = search(args)
        else:
            raise ToolError("unknown tool %r" % (tool,))
    except ToolError as e:
        out = "ERROR: %s" % (e,)
    sys.stdout.write(out if out.endswith("\n") else out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
