"""Lenient parsing of a chess move written by a language model, with python-chess.

Accepted, in the position of ``board``: UCI (``e2e4``, ``e7e8q``, ``E2E4``, ``e2-e4``,
``e2 e4``, ``e4xd5``, ``e7e8=Q``), SAN (``e4``, ``Nf3``, ``Nf3+``, ``exd5``, ``O-O``, ``0-0``,
``e8=Q#``), long algebraic (``Ng1-f3``, ``Ng1f3``) and case quirks (``nf3``, ``NF3``), wrapped
in labels, move numbers, markdown or quotes (``Move: e2e4``, ``Action: **Nf3**``, ``1. e4``,
``12... Nf6``, ```` `e4` ````, ``"e4".``).  Castling may also be written king-takes-rook
(``e1h1``), as python-chess's ``parse_uci`` accepts.
"""

from __future__ import annotations

import re

import chess

from ...errors import EnvError
from ..prompting import extract_action

__all__ = ["MoveError", "parse_move", "legal_moves_uci"]

# ``\s*(?:\*+\s*)?`` is ``\s*\**\s*`` without its quadratic backtracking on a long run of spaces
_LABEL_RE = re.compile(r"(?i)\b(?:action|move|answer)\b\s*(?:\*+\s*)?[:=]")
_STRIP_CHARS = "*`\"'\u201c\u201d\u2018\u2019<>[](){}"
_MOVE_NUMBER_RE = re.compile(r"^\d+\s*\.+")
_SQUARE_RE = re.compile(r"^[a-h][1-8]$")
_UCI_RE = re.compile(r"^([a-h][1-8])[-x:]?([a-h][1-8])=?([qrbn])?$")
_SANISH_RE = re.compile(r"^(?:[NBRQK]?[a-h]?[1-8]?[-x:]?[a-h][1-8](?:=?[NBRQ])?|O-O(?:-O)?)[+#]?$", re.IGNORECASE)
_MAX_TOKENS = 64


class MoveError(EnvError, ValueError):
    """A move text could not be turned into a legal move of the position.

    Attributes:
        kind: ``"unparsable"`` (nothing looks like a move), ``"illegal"`` (a move in valid
            notation that is not legal here) or ``"ambiguous"`` (SAN matching several moves).
        text: the offending text.
    """

    def __init__(self, message: str, *, kind: str, text: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.text = text


def legal_moves_uci(board: chess.Board) -> list[str]:
    """The legal moves of ``board`` in UCI, sorted (a new list on every call)."""
    return sorted(m.uci() for m in board.legal_moves)


def _tokens(text: str) -> list[str]:
    if "\n" in text.strip():
        text = extract_action(text)
    labels = list(_LABEL_RE.finditer(text))
    if labels:
        text = text[labels[-1].end():]
    for ch in _STRIP_CHARS:
        text = text.replace(ch, " ")
    raw = text.split()[:_MAX_TOKENS]
    out: list[str] = []
    for tok in raw:
        tok = _MOVE_NUMBER_RE.sub("", tok).strip(".,;:!?")
        if tok:
            out.append(tok)
    # "e2 e4" -> "e2e4"
    merged: list[str] = []
    i = 0
    while i < len(out):
        if i + 1 < len(out) and _SQUARE_RE.match(out[i].lower()) and re.match(r"^[a-h][1-8](?:=?[qrbn])?$", out[i + 1].lower()):
            merged.append(out[i] + out[i + 1])
            i += 2
            continue
        merged.append(out[i])
        i += 1
    return merged


def _san_variants(tok: str) -> list[str]:
    t = tok.replace("0", "O").replace("o", "O") if re.fullmatch(r"[0oO](?:-[0oO]){1,2}[+#]?", tok) else tok
    variants = [t]
    if t[:1].lower() in "nrqk" and len(t) >= 3:
        variants.append(t[0].upper() + t[1:].lower())
    if t[:1].lower() == "b" and len(t) >= 3:
        variants.append("b" + t[1:].lower())  # pawn on the b-file
        variants.append("B" + t[1:].lower())  # bishop
    variants.append(t.lower())
    # promotion piece in upper case: e8=q -> e8=Q
    variants += [re.sub(r"=([nbrq])", lambda m: "=" + m.group(1).upper(), v) for v in list(variants)]
    seen: list[str] = []
    for v in variants:
        if v not in seen:
            seen.append(v)
    return seen


def _promotion_hint(board: chess.Board, tok: str) -> str:
    """The hint for SAN naming a pawn move to the last rank without its piece (``d1`` for ``d2d1q``), else ""."""
    if not re.fullmatch(r"[a-h](?:[-x:]?[a-h])?[18][+#]?", tok.lower()):
        return ""
    try:
        move = board.parse_san(tok.lower().rstrip("+#") + "=Q")
    except ValueError:  # IllegalMoveError, AmbiguousMoveError, InvalidMoveError
        return ""
    return f" (a promotion needs its piece, e.g. {move.uci()})"


def parse_move(board: chess.Board, text: str) -> chess.Move:
    """The legal move of ``board`` that ``text`` names (see the module docstring for what is accepted).

    Tokens are tried left to right after the last ``Action:``/``Move:`` label; the first that
    names a legal move wins.  Does not modify ``board``.

    Returns:
        a legal :class:`chess.Move` of ``board``.

    Raises:
        MoveError: ``kind="unparsable"`` when no token is move notation, ``"illegal"`` or
            ``"ambiguous"`` for the first token in move notation that is not a legal move here;
            the message names the text and what would be valid.
    """
    first_problem: MoveError | None = None
    for tok in _tokens(text):
        low = tok.lower()
        m = _UCI_RE.match(low)
        if m:
            uci = m.group(1) + m.group(2) + (m.group(3) or "")
            try:
                return board.parse_uci(uci)
            except chess.IllegalMoveError:
                if first_problem is None:
                    hint = ""
                    mv = chess.Move.from_uci(uci)
                    if mv.promotion is None and chess.Move(mv.from_square, mv.to_square, chess.QUEEN) in board.legal_moves:
                        hint = f" (a promotion needs its piece, e.g. {uci}q)"
                    first_problem = MoveError(f"{tok!r} ({uci}) is not a legal move in this position{hint}",
                                              kind="illegal", text=tok)
            except ValueError:
                pass
        if _SANISH_RE.match(tok) or re.fullmatch(r"[0oO](?:-[0oO]){1,2}[+#]?", tok):
            for v in _san_variants(tok):
                try:
                    return board.parse_san(v)
                except chess.AmbiguousMoveError:
                    if first_problem is None or first_problem.kind != "ambiguous":
                        first_problem = MoveError(f"{tok!r} is ambiguous in this position; name the origin square "
                                                  "(e.g. Nbd2) or use UCI (e.g. b1d2)", kind="ambiguous", text=tok)
                except (chess.IllegalMoveError, chess.InvalidMoveError, ValueError):
                    continue
            if first_problem is None:
                first_problem = MoveError(f"{tok!r} is not a legal move in this position{_promotion_hint(board, tok)}",
                                          kind="illegal", text=tok)
    if first_problem is not None:
        raise first_problem
    shown = text.strip()
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise MoveError(f"could not read a chess move in {shown!r}; write one move in UCI (e.g. e2e4) or SAN (e.g. Nf3)",
                    kind="unparsable", text=text)
