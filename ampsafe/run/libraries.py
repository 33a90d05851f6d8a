"""What the run does when a training library is imported: the AMP-safe necks registered in PaddleOCR and
PaddleDetection (so swapped configs build), and ``--emulate-fp16``'s trainer integrations
(:mod:`ampsafe.run.integrations`). Each takes the run's :class:`~ampsafe.run.session.RunSession`: its banner,
its list of changes, its ledger."""

from __future__ import annotations

__all__ = ["register_ocr", "register_det", "integrate"]


def register_ocr(session) -> None:
    from ..patches import register_paddleocr
    from ..patches.register import ppocr_registration_line

    done = register_paddleocr()
    if done.get("ppocr"):
        session.changes.append(f"safe necks registered in PaddleOCR's ppocr: {', '.join(sorted(done['ppocr']))}")
        session.say(ppocr_registration_line(done))


def register_det(session) -> None:
    from ..patches import register_paddledet

    names = register_paddledet()
    session.changes.append(f"ppdet necks registered: {', '.join(names)}")
    session.say(f"ppdet necks registered: {', '.join(names)}")


def integrate(session, name: str, module) -> None:
    """--emulate-fp16: one trainer's integration; its lines go to the banner and the changes, each once."""
    from .integrations import apply

    def tell(line: str) -> None:
        if line not in session.changes:
            session.changes.append(line)
            session.say(line)

    tell(apply(name, module, session.set_attr, tell))
