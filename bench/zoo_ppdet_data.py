"""The synthetic training data of the PaddleDetection zoo (bench/zoo_ppdet.py), one writer per dataset class the
tree's configs train on: each writes, once, the few files that class's own ``parse_dataset`` reads, and returns the
``TrainDataset`` keys that point the class at them. Seeded, so a rerun writes the same bytes.

Every writer draws the same scene: dark noise with three filled rectangles (bright or grey), the rectangles being
the objects (COCO boxes and polygons, DOTA-style rotated boxes after the config's own ``Poly2RBox``, VOC boxes,
MOT boxes with a track id each, WIDER FACE boxes); a person for the keypoint and 3D-pose classes is a rectangle
with its joints spread on a grid inside it; a lane is a straight line drawn across the lower image.

A config whose TrainDataset class has no writer here is built and not scanned, its row saying so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

__all__ = ["WRITERS", "LOAD_CHECKED", "child_cwd", "write_coco", "write_dataset"]

_SCENE_OBJECTS = 3


def _scene(rng, size: tuple[int, int]):
    """An image of ``size`` (h, w) and its objects: (category 1 or 2, x, y, w, h) in pixels."""
    import numpy as np

    height, width = size
    img = (rng.random((height, width, 3)) * 60).astype(np.uint8)
    objects = []
    for k in range(_SCENE_OBJECTS):
        category = k % 2 + 1
        x = int(rng.integers(5, width // 2))
        y = int(rng.integers(5, height // 2))
        w = int(rng.integers(width // 6, width // 2))
        h = int(rng.integers(height // 6, height // 2))
        img[y : y + h, x : x + w] = 200 if category == 1 else 120
        objects.append((category, x, y, w, h))
    return img, objects


def _imwrite(path: Path, img) -> None:
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), img)


def _scenes(seed: int, n: int, size: int):
    """``n`` seeded square scenes of ``size``: (index, image, objects), one random stream for all of them."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for i in range(n):
        yield (i, *_scene(rng, (size, size)))


def write_coco(root: Path, n: int, size: int = 320, seed: int = 0) -> Path:
    """``n`` JPEGs with three filled rectangles each, and their COCO json (boxes and rectangle polygons)."""

    if (root / "train.json").is_file():
        return root
    images, annotations = [], []
    for i, img, objects in _scenes(seed, n, size):
        for category, x, y, w, h in objects:
            poly = [x, y, x + w, y, x + w, y + h, x, y + h]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i + 1,
                    "category_id": category,
                    "bbox": [x, y, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                    "segmentation": [poly],
                }
            )
        _imwrite(root / "images" / f"{i}.jpg", img)
        images.append({"id": i + 1, "file_name": f"{i}.jpg", "width": size, "height": size})
    categories = [{"id": 1, "name": "bright"}, {"id": 2, "name": "grey"}]
    (root / "train.json").write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    return root


def _coco(root: Path, n: int, size: int, seed: int, args: dict) -> dict:
    """The COCO folder; for a config that reads ``gt_track_id`` (CenterTrack) a copy of its json whose every
    annotation has a ``track_id`` (the rectangle's index in its image, so each id runs through the frames); for a
    one-class config (the MOT detectors) a copy with one category."""
    write_coco(root, n, size, seed)
    tracks = "gt_track_id" in (args.get("data_fields") or [])
    one_class = args.get("_classes") == 1
    if not (tracks or one_class):
        return {"dataset_dir": str(root), "image_dir": "images", "anno_path": "train.json"}
    anno = "train" + ("_track" if tracks else "") + ("_1class" if one_class else "") + ".json"
    if not (root / anno).is_file():
        doc = json.loads((root / "train.json").read_text())
        seen: dict[int, int] = {}
        for a in doc["annotations"]:
            if tracks:
                a["track_id"] = seen[a["image_id"]] = seen.get(a["image_id"], -1) + 1
            if one_class:
                a["category_id"] = 1
        if one_class:
            doc["categories"] = doc["categories"][:1]
        (root / anno).write_text(json.dumps(doc))
    return {"dataset_dir": str(root), "image_dir": "images", "anno_path": anno}


def _joints_in(rng, x: int, y: int, w: int, h: int, count: int):
    """``count`` joints inside the box, on a jittered grid, all visible (COCO visibility 2)."""
    cols = 3
    rows = -(-count // cols)
    out = []
    for j in range(count):
        jx = x + w * ((j % cols) + 0.5 + rng.uniform(-0.3, 0.3)) / cols
        jy = y + h * ((j // cols) + 0.5 + rng.uniform(-0.3, 0.3)) / rows
        out.append((round(float(jx), 1), round(float(jy), 1)))
    return out


def _keypoints(root: Path, n: int, size: int, seed: int, args: dict) -> dict:
    """COCO person-keypoints json (what pycocotools and the keypoint datasets read): every rectangle is a person
    whose ``num_joints`` joints lie inside it."""
    import numpy as np

    joints = int(args.get("num_joints") or 17)
    anno = root / f"person_keypoints_{joints}.json"
    if not anno.is_file():
        rng = np.random.default_rng(seed)
        images, annotations = [], []
        for i in range(n):
            img, objects = _scene(rng, (size, size))
            for _, x, y, w, h in objects:
                points = _joints_in(rng, x, y, w, h, joints)
                annotations.append(
                    {
                        "id": len(annotations) + 1,
                        "image_id": i + 1,
                        "category_id": 1,
                        "bbox": [x, y, w, h],
                        "area": w * h,
                        "iscrowd": 0,
                        "segmentation": [[x, y, x + w, y, x + w, y + h, x, y + h]],
                        "num_keypoints": joints,
                        "keypoints": [v for px, py in points for v in (px, py, 2)],
                    }
                )
            _imwrite(root / "images" / f"{i}.jpg", img)
            images.append({"id": i + 1, "file_name": f"{i}.jpg", "width": size, "height": size})
        categories = [{"id": 1, "name": "person", "keypoints": [f"j{k}" for k in range(joints)], "skeleton": []}]
        anno.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return {"dataset_dir": str(root), "image_dir": "images", "anno_path": anno.name}


def _voc(root: Path, n: int, size: int, seed: int, args: dict) -> dict:
    """Pascal VOC: one xml per image, ``trainval.txt`` pairing image and xml, ``label_list.txt``."""

    names = {1: "bright", 2: "grey"}
    if not (root / "trainval.txt").is_file():
        pairs = []
        for i, img, objects in _scenes(seed, n, size):
            _imwrite(root / "JPEGImages" / f"{i}.jpg", img)
            boxes = "".join(
                f"<object><name>{names[c]}</name><difficult>0</difficult><bndbox><xmin>{x}</xmin><ymin>{y}</ymin>"
                f"<xmax>{x + w}</xmax><ymax>{y + h}</ymax></bndbox></object>"
                for c, x, y, w, h in objects
            )
            xml = f"<annotation><size><width>{size}</width><height>{size}</height><depth>3</depth></size>{boxes}</annotation>"
            (root / "Annotations").mkdir(parents=True, exist_ok=True)
            (root / "Annotations" / f"{i}.xml").write_text(xml)
            pairs.append(f"JPEGImages/{i}.jpg Annotations/{i}.xml")
        (root / "label_list.txt").write_text("\n".join(names.values()) + "\n")
        (root / "trainval.txt").write_text("\n".join(pairs) + "\n")
    return {"dataset_dir": str(root), "anno_path": "trainval.txt", "label_list": "label_list.txt"}


def _mot(root: Path, n: int, size: int, seed: int, args: dict) -> dict:
    """The JDE/FairMOT layout MOTDataSet reads: ``image_lists/synthetic.train`` listing ``synthetic/images/*.jpg``,
    and beside each a ``labels_with_ids/*.txt`` of ``class id cx cy w h`` (normalized), one id per rectangle that
    stays with it from frame to frame."""

    if not (root / "image_lists" / "synthetic.train").is_file():
        listed = []
        for i, img, objects in _scenes(seed, n, size):
            _imwrite(root / "synthetic" / "images" / f"{i:05d}.jpg", img)
            lines = [
                f"0 {k} {(x + w / 2) / size:.6f} {(y + h / 2) / size:.6f} {w / size:.6f} {h / size:.6f}"
                for k, (_, x, y, w, h) in enumerate(objects)
            ]
            (root / "synthetic" / "labels_with_ids").mkdir(parents=True, exist_ok=True)
            (root / "synthetic" / "labels_with_ids" / f"{i:05d}.txt").write_text("\n".join(lines) + "\n")
            listed.append(f"synthetic/images/{i:05d}.jpg")
        (root / "image_lists").mkdir(parents=True, exist_ok=True)
        (root / "image_lists" / "synthetic.train").write_text("\n".join(listed) + "\n")
    return {"dataset_dir": str(root), "image_lists": ["synthetic.train"]}


def _widerface(root: Path, n: int, size: int, seed: int, args: dict) -> dict:
    """WIDER FACE's ground-truth text: an image path line, a box count line, then ``x y w h`` + six zero flags a
    box (the layout of wider_face_train_bbx_gt.txt)."""

    if not (root / "train_bbx_gt.txt").is_file():
        lines = []
        for i, img, objects in _scenes(seed, n, size):
            _imwrite(root / "images" / f"{i}.jpg", img)
            lines += [f"{i}.jpg", str(len(objects))]
            lines += [f"{x} {y} {w} {h} 0 0 0 0 0 0 " for _, x, y, w, h in objects]
        (root / "train_bbx_gt.txt").write_text("\n".join(lines) + "\n")
    return {"dataset_dir": str(root), "image_dir": "images", "anno_path": "train_bbx_gt.txt"}


# CULane's frame: the configs' cut_height (270) and their reader's crop and resize assume 1640x590 images
CULANE_FRAME = (590, 1640)


def _culane(root: Path, n: int, size: int, seed: int, args: dict) -> dict:
    """CULane's layout: ``list/train_gt.txt`` lines ``image mask e1 e2 e3 e4`` and beside each image its
    ``.lines.txt`` (one lane a line: x y pairs bottom to top). Four straight lanes a frame, at CULane's frame size
    (the config's ``cut_height`` is in those pixels); the masks are written too (the list names one)."""
    import numpy as np

    if not (root / "list" / "train_gt.txt").is_file():
        rng = np.random.default_rng(seed)
        height, width = CULANE_FRAME
        listed = []
        for i in range(n):
            img = (rng.random((height, width, 3)) * 60).astype(np.uint8)
            mask = np.zeros((height, width), np.uint8)
            lanes = []
            for lane in range(4):
                bottom = width * (lane + 0.5) / 4 + rng.uniform(-60, 60)
                top = width / 2 + (lane - 1.5) * 40 + rng.uniform(-20, 20)
                ys = np.arange(height - 10, 300, -20)
                xs = bottom + (top - bottom) * (height - 10 - ys) / (height - 310)
                points = np.stack([xs, ys], 1).round(1)
                lanes.append(" ".join(f"{x} {y}" for x, y in points))
                for (x0, y0), (x1, y1) in zip(points[:-1], points[1:]):
                    import cv2

                    cv2.line(img, (int(x0), int(y0)), (int(x1), int(y1)), (220, 220, 220), 8)
                    cv2.line(mask, (int(x0), int(y0)), (int(x1), int(y1)), lane + 1, 16)
            _imwrite(root / "frames" / f"{i:05d}.jpg", img)
            _imwrite(root / "masks" / f"{i:05d}.png", mask)
            (root / "frames" / f"{i:05d}.lines.txt").write_text("\n".join(lanes) + "\n")
            listed.append(f"/frames/{i:05d}.jpg /masks/{i:05d}.png 1 1 1 1")
        (root / "list").mkdir(parents=True, exist_ok=True)
        (root / "list" / "train_gt.txt").write_text("\n".join(listed) + "\n")
    return {"dataset_dir": str(root), "list_path": "list/train_gt.txt"}


def _pose3d(root: Path, n: int, size: int, seed: int, args: dict) -> dict:
    """Pose3DDataset's json (``{"data": [...]}``: image name, box centre and scale, 24 2D joints with a
    visibility, 24 3D joints with a confidence), one person (the first rectangle) an image; the 3D joints are the
    2D ones lifted to a depth around 0 in metres-sized units, relative to the pelvis as the datasets store them."""
    import numpy as np

    if not (root / "pose3d_train.json").is_file():
        rng = np.random.default_rng(seed)
        data = []
        for i in range(n):
            img, objects = _scene(rng, (size, size))
            _imwrite(root / "images" / f"{i}.jpg", img)
            _, x, y, w, h = objects[0]
            joints = _joints_in(rng, x, y, w, h, 24)
            pelvis = joints[14]
            data.append(
                {
                    "imageName": f"{i}.jpg",
                    "bbox_center": [x + w / 2, y + h / 2],
                    "bbox_scale": max(w, h) / 200,
                    "gt_keypoint_2d": [[px, py, 1.0] for px, py in joints],
                    "pose3d": [
                        [(px - pelvis[0]) / size, (py - pelvis[1]) / size, float(rng.uniform(-0.1, 0.1)), 1.0]
                        for px, py in joints
                    ],
                }
            )
        (root / "pose3d_train.json").write_text(json.dumps({"data": data}))
    return {"dataset_dir": str(root), "image_dirs": ["images"], "anno_list": ["pose3d_train.json"]}


Writer = Callable[[Path, int, int, int, dict], dict]
WRITERS: dict[str, Writer] = {
    "COCODataSet": _coco,
    "SemiCOCODataSet": _coco,  # COCO's json; the labeled and the unlabeled dataset read the same images
    "KeypointTopDownCocoDataset": _keypoints,
    "KeypointBottomUpCocoDataset": _keypoints,
    "VOCDataSet": _voc,
    "MOTDataSet": _mot,
    "WIDERFaceDataSet": _widerface,
    "CULaneDataSet": _culane,
    "Pose3DDataset": _pose3d,
}


def write_dataset(
    name: str | None,
    root: Path,
    n: int,
    size: int,
    seed: int = 0,
    args: dict | None = None,
    classes: int | None = None,
) -> dict:
    """Write the synthetic data of dataset class ``name`` beside the COCO folder ``root`` (once) and return the
    ``TrainDataset`` keys that read it; ``classes``: the config's ``num_classes`` (a one-class config, the MOT
    detectors', gets its objects as one category). Raises KeyError for a class with no writer."""
    if name not in WRITERS:
        raise KeyError(name)
    folder = root if name == "COCODataSet" else root.parent / f"{root.name}-{name}"
    return WRITERS[name](folder, n, size, seed, {**(args or {}), "_classes": classes})


# files that a config's datasets check for when the config loads, relative to the directory ppdet runs in:
# configs/datasets/wider_face.yml's EvalDataset, a WIDERFaceValDataset, asserts its four ground-truth .mat files in
# its constructor (ppdet/data/source/widerface.py); a training run never reads them
LOAD_CHECKED = tuple(
    f"dataset/wider_face/WIDER_val/ground_truth/wider_{part}val.mat" for part in ("face_", "hard_", "medium_", "easy_")
)


def child_cwd(folder: Path) -> Path:
    """``folder``, made, with an empty file at each of :data:`LOAD_CHECKED`: the working directory of a ppdet child,
    so that the configs whose datasets check those files load, and a dataset that caches its parse under the
    working directory (CULaneDataSet: ``./cache``) writes it there, never in the tree."""
    for rel in LOAD_CHECKED:
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    return folder
