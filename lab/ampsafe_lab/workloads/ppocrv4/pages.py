"""Rendered text pages with their boxes in PaddleOCR's detection label format, deterministic by seed.

    page = render_page(seed=0, index=3)                  # .image (H, W, 3) uint8 RGB, .boxes [{"transcription", "points"}]
    x = normalize(page.image)                            # (3, H, W) float32, as PaddleOCR's det pipeline feeds it
    write_pages(folder, count=8, seed=0, held_out=True)  # img_0000.png ... + label.txt that SimpleDataSet reads
    render_page(seed=0, index=3, style="screens")        # light text on a near-black ground

A page is paragraphs of random words set in TrueType fonts (DejaVu and STIX, regular / bold / italic / mono /
serif), at 12 to 44 px, with stroke widths 0 to 2, in one to four phrases per line (a phrase is the unit
PP-OCR's detector outputs: words a space apart; phrases are several em apart), over plain, tinted, graded or
grainy paper or, sometimes, light text on a dark ground. ``style="screens"`` sets every page light on a
near-black ground (0 to 24 of 255: dark-mode screenshots, terminals, subtitles on black), the pages on which
the shipped PP-OCRv4 detector's head runs hottest (its ``head.binarize.conv1`` passes 65504 on many of them,
in inference). Each phrase is labelled with its axis-aligned box,
clockwise from the top left, exactly as PaddleOCR's ``DetLabelEncode`` reads a label line::

    img_0000.png\t[{"transcription": "word word", "points": [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]}, ...]

Everything is a pure function of (seed, stream, index): train pages (stream 0) and held-out pages (stream 1)
never coincide. The fonts are the ones matplotlib ships (a dependency of the ``det`` extra), so every machine
renders the same pixels for the same version.
"""

from __future__ import annotations

import importlib.util
import json
import string
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..imagenet import IMAGE_MEAN, IMAGE_STD, normalize_chw

__all__ = [
    "Page",
    "IMAGE_MEAN",
    "IMAGE_STD",
    "TRAIN_STREAM",
    "HELD_OUT_STREAM",
    "STYLES",
    "font_files",
    "render_page",
    "normalize",
    "label_line",
    "write_pages",
]

TRAIN_STREAM, HELD_OUT_STREAM = 0, 1
STYLES = ("paper", "screens")
FONTS = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "STIXGeneral.ttf",
    "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf",
)
_LOWER = string.ascii_lowercase
_PUNCT = ",.;:!?-"


@dataclass
class Page:
    """A rendered page: ``image`` (H, W, 3) uint8 RGB and ``boxes`` in PaddleOCR's label format."""

    image: np.ndarray
    boxes: list[dict] = field(default_factory=list)

    @property
    def polys(self) -> np.ndarray:
        """The boxes as an (N, 4, 2) float32 array (DetLabelEncode's ``polys``)."""
        return np.array([b["points"] for b in self.boxes], dtype=np.float32).reshape(-1, 4, 2)


def font_files() -> list[Path]:
    """The TrueType files pages are set in, from matplotlib's bundled fonts (found without importing it)."""
    spec = importlib.util.find_spec("matplotlib")
    if spec is None or not spec.submodule_search_locations:
        from ampsafe.errors import ConfigError

        raise ConfigError("rendering text pages needs matplotlib's bundled fonts: pip install matplotlib")
    folder = Path(next(iter(spec.submodule_search_locations))) / "mpl-data" / "fonts" / "ttf"
    return [folder / name for name in FONTS if (folder / name).is_file()]


def _rng(seed: int, stream: int, index: int, style: str = "paper") -> np.random.Generator:
    words = [int(seed), int(stream), int(index), 0x0C4]
    return np.random.default_rng(words if style == "paper" else [*words, STYLES.index(style)])


def _word(rng: np.random.Generator) -> str:
    kind = rng.random()
    if kind < 0.12:
        return str(rng.integers(0, 10 ** int(rng.integers(1, 6))))
    word = "".join(rng.choice(list(_LOWER), size=int(rng.integers(2, 10))))
    if kind < 0.35:
        word = word.capitalize()
    elif kind < 0.42:
        word = word.upper()
    if rng.random() < 0.1:
        word += str(rng.choice(list(_PUNCT)))
    return word


def _background(rng: np.random.Generator, height: int, width: int, style: str) -> tuple[np.ndarray, bool]:
    """(float32 (H, W, 3) in [0, 255], dark): plain, tinted, graded or grainy paper, or a dark ground."""
    dark = rng.random() < 0.15 or style == "screens"
    low = (0, 24) if style == "screens" else (10, 70)
    base = rng.uniform(*low, size=3) if dark else rng.uniform(200, 255, size=3)
    if rng.random() < 0.5:  # grey paper, not tinted
        base[:] = base.mean()
    image = np.broadcast_to(base, (height, width, 3)).astype(np.float32)
    style = rng.integers(0, 3)
    if style == 1:  # a linear grade across the page
        angle = rng.uniform(0, 2 * np.pi)
        ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
        ramp = (np.cos(angle) * xs / width + np.sin(angle) * ys / height)[..., None]
        image = image + rng.uniform(-40, 40) * ramp
    elif style == 2:  # paper grain: coarse noise, upsampled
        cell = int(rng.integers(2, 9))
        coarse = rng.normal(0, rng.uniform(3, 12), size=(height // cell + 1, width // cell + 1, 1))
        image = image + np.repeat(np.repeat(coarse, cell, 0), cell, 1)[:height, :width]
    return np.clip(image, 0, 255), dark


def render_page(
    seed: int = 0, index: int = 0, *, size: tuple[int, int] = (640, 640), held_out: bool = False, style: str = "paper"
) -> Page:
    """Page ``index`` of the train (or held-out) stream for ``seed`` in ``style`` (:data:`STYLES`); ``size`` is
    (height, width)."""
    from PIL import Image, ImageDraw, ImageFont

    if style not in STYLES:
        from ampsafe.errors import ConfigError

        raise ConfigError(f"page style must be one of {', '.join(STYLES)}, got {style!r}")
    rng = _rng(seed, HELD_OUT_STREAM if held_out else TRAIN_STREAM, index, style)
    height, width = size
    ground, dark = _background(rng, height, width, style)
    image = Image.fromarray(ground.astype(np.uint8))
    draw = ImageDraw.Draw(image)
    fonts = font_files()
    density = rng.uniform(0.45, 1.0)  # the chance that a line slot carries text
    margin = int(rng.integers(8, 40))
    y, boxes = margin, []
    while True:
        font = ImageFont.truetype(str(fonts[int(rng.integers(len(fonts)))]), int(rng.integers(12, 45)))
        stroke = int(rng.choice([0, 0, 0, 1, 2]))
        ink = tuple(int(v) for v in (rng.uniform(200, 255, 3) if dark else rng.uniform(0, 90, 3)))
        step = int(font.size * rng.uniform(1.25, 2.0)) + 2 * stroke
        for _ in range(int(rng.integers(1, 6))):  # the lines of one paragraph
            if y + step > height - margin:
                return Page(np.asarray(image).copy(), boxes)
            if rng.random() < density:
                boxes += _set_line(draw, rng, font, stroke, ink, y, margin, width)
            y += step
        y += int(font.size * rng.uniform(0.3, 1.5))


def _set_line(draw, rng, font, stroke: int, ink, y: int, margin: int, width: int) -> list[dict]:
    """Draw one line of phrases from the left margin; return their labels. A phrase loses words from its end
    until it fits before the right margin; the line ends at the first phrase of which no word fits."""
    boxes, x = [], margin + int(rng.integers(0, width // 4))
    for _ in range(int(rng.integers(1, 5))):
        words = [_word(rng) for _ in range(int(rng.integers(1, 6)))]
        while words:
            text = " ".join(words)
            left, top, right, bottom = draw.textbbox((x, y), text, font=font, stroke_width=stroke)
            if right <= width - margin:
                break
            words.pop()
        if not words or bottom - top < 4:
            break
        draw.text((x, y), text, fill=ink, font=font, stroke_width=stroke, stroke_fill=ink)
        points = [[left, top], [right, top], [right, bottom], [left, bottom]]
        boxes.append({"transcription": text, "points": [[int(px), int(py)] for px, py in points]})
        x = right + int(font.size * rng.uniform(2.0, 6.0))
    return boxes


def normalize(image: np.ndarray) -> np.ndarray:
    """(3, H, W) float32 as PaddleOCR's det pipeline feeds the network: DecodeImage's BGR order, /255, ImageNet
    mean and std (NormalizeImage, applied to the BGR channels as upstream applies them), CHW (ToCHWImage)."""
    return normalize_chw(np.asarray(image)[..., ::-1])


def label_line(path: str, boxes: list[dict]) -> str:
    """One line of a PaddleOCR detection label file: ``path<TAB>json``."""
    return f"{path}\t{json.dumps(boxes, ensure_ascii=False)}"


def write_pages(
    folder: str | Path, count: int, *, seed: int = 0, held_out: bool = False, size: tuple[int, int] = (640, 640)
) -> Path:
    """Write pages 0..count-1 as ``img_NNNN.png`` and their labels as ``label.txt`` in ``folder`` (paths relative
    to it: PaddleOCR's SimpleDataSet with ``data_dir: folder``, ``label_file_list: [folder/label.txt]``)."""
    from PIL import Image

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for index in range(count):
        page = render_page(seed, index, size=size, held_out=held_out)
        name = f"img_{index:04d}.png"
        Image.fromarray(page.image).save(folder / name)
        lines.append(label_line(name, page.boxes))
    labels = folder / "label.txt"
    labels.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return labels
