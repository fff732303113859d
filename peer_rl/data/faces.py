"""Small synthetic face frames for the visual sample rows (no third-party images are shipped)."""
from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

from peer_rl.files.out_paths import write_whole

EXPRESSIONS = ("sad", "anxious", "angry", "afraid", "happy", "neutral")
SIZE = 64

# which drawn expression stands for a fine-grained emotion label
EMOTION_TO_EXPRESSION = {
    "sadness": "sad", "loneliness": "sad", "disappointment": "sad", "hopelessness": "sad",
    "guilt": "sad", "shame": "sad", "anxiety": "anxious", "confusion": "anxious",
    "anger": "angry", "frustration": "angry", "fear": "afraid",
    "joy": "happy", "relief": "happy", "gratitude": "happy",
}


def expression_for(emotions: list[str], sentiment: str) -> str:
    for e in emotions:
        if e in EMOTION_TO_EXPRESSION:
            return EMOTION_TO_EXPRESSION[e]
    return "happy" if sentiment == "positive" else "neutral"


def draw_face(expression: str, frame: int) -> Image.Image:
    """A 64x64 cartoon face; frame 2 is the same expression, slightly stronger."""
    img = Image.new("RGB", (SIZE, SIZE), (235, 240, 248))
    d = ImageDraw.Draw(img)
    d.ellipse((6, 4, 58, 60), fill=(241, 200, 160), outline=(120, 80, 60), width=2)
    k = 1 if frame == 1 else 2
    eye_h = {"afraid": 5 + k, "anxious": 4 + k}.get(expression, 3)
    for x in (22, 42):
        d.ellipse((x - 3, 26 - eye_h, x + 3, 26 + eye_h), fill=(40, 30, 30))
    brows = {
        "sad": ((16, 18, 26, 16 - k), (38, 16 - k, 48, 18)),
        "angry": ((16, 15 - k, 27, 19 + k), (37, 19 + k, 48, 15 - k)),
        "afraid": ((16, 14 - k, 27, 12 - k), (37, 12 - k, 48, 14 - k)),
        "anxious": ((16, 17, 27, 15 - k), (37, 15 - k, 48, 17)),
    }.get(expression, ((16, 18, 27, 18), (37, 18, 48, 18)))
    for b in brows:
        d.line(b, fill=(90, 60, 40), width=2)
    if expression == "happy":
        d.arc((20, 34 - k, 44, 50 + k), 20, 160, fill=(150, 40, 40), width=2)
    elif expression == "sad":
        d.arc((20, 42, 44, 58 + k), 200, 340, fill=(150, 40, 40), width=2)
        if frame == 2:
            d.ellipse((40, 32, 44, 38), fill=(120, 170, 230))
    elif expression == "afraid":
        d.ellipse((27, 40, 37, 50 + k), fill=(110, 30, 30))
    elif expression == "anxious":
        d.line((22, 46, 27, 44 - k, 32, 46, 37, 44 - k, 42, 46), fill=(150, 40, 40), width=2)
    elif expression == "angry":
        d.line((22, 47, 42, 47 - k + 1), fill=(150, 40, 40), width=3)
    else:
        d.line((24, 46, 40, 46), fill=(150, 40, 40), width=2)
    return img


def write_faces(directory: Path) -> dict[tuple[str, int], str]:
    """Write every expression x frame as PNG; returns (expression, frame) -> file name."""
    directory.mkdir(parents=True, exist_ok=True)
    names = {}
    for expr in EXPRESSIONS:
        for frame in (1, 2):
            name = f"face_{expr}_{frame}.png"
            image = draw_face(expr, frame)
            write_whole(directory / name,
                        lambda fh, im=image: im.save(fh, format="PNG", optimize=False))
            names[(expr, frame)] = name
    return names
