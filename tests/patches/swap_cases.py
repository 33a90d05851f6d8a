"""Which upstream config the swap rewrites (and to what) and which it refuses (and why): the expectation table."""

from __future__ import annotations

import os
from pathlib import Path

UPSTREAM = Path(os.environ.get("AMPSAFE_SHARED", Path(__file__).resolve().parents[3] / "shared")) / "upstream"

# upstream config (relative to shared/upstream) -> the safe neck names the rewrite must contain
REWRITTEN = {
    "PaddleOCR/configs/det/det_mv3_db.yml": ["AmpSafeDBFPN"],
    "PaddleOCR/configs/det/det_mv3_db_amp.yml": ["AmpSafeDBFPN"],
    "PaddleOCR/configs/det/det_r50_vd_db.yml": ["AmpSafeDBFPN"],
    "PaddleOCR/configs/det/det_res18_db_v2.0.yml": ["AmpSafeDBFPN"],
    "PaddleOCR/configs/det/det_r50_db++_icdar15.yml": ["AmpSafeDBFPN"],
    "PaddleOCR/configs/det/ch_ppocr_v2.0/ch_det_mv3_db_v2.0.yml": ["AmpSafeDBFPN"],
    "PaddleOCR/configs/det/ch_PP-OCRv3/ch_PP-OCRv3_det_student.yml": ["AmpSafeRSEFPN"],
    "PaddleOCR/configs/det/ch_PP-OCRv3/ch_PP-OCRv3_det_cml.yml": ["AmpSafeRSEFPN", "AmpSafeRSEFPN", "AmpSafeLKPAN"],
    "PaddleOCR/configs/det/ch_PP-OCRv4/ch_PP-OCRv4_det_student.yml": ["AmpSafeRSEFPN"],
    "PaddleOCR/configs/det/ch_PP-OCRv4/ch_PP-OCRv4_det_teacher.yml": ["AmpSafeLKPAN"],
    "PaddleOCR/configs/det/PP-OCRv4/PP-OCRv4_mobile_det.yml": ["AmpSafeRSEFPN"],
    "PaddleOCR/configs/det/PP-OCRv4/PP-OCRv4_server_det.yml": ["AmpSafeLKPAN"],
    "PaddleOCR/configs/det/PP-OCRv5/PP-OCRv5_mobile_det.yml": ["AmpSafeRSEFPN"],
    "PaddleOCR/configs/det/PP-OCRv5/PP-OCRv5_server_det.yml": ["AmpSafeLKPAN"],
    "PaddleOCR/configs/det/det_repsvtr_db.yml": ["AmpSafeRSEFPN"],
    "PaddleDetection/configs/faster_rcnn/faster_rcnn_r50_fpn_1x_coco.yml": ["AmpSafeFPN"],
    "PaddleDetection/configs/faster_rcnn/_base_/faster_rcnn_r50_fpn.yml": ["AmpSafeFPN"],
    "PaddleDetection/dygraph/configs/faster_rcnn/_base_/faster_rcnn_r50_fpn.yml": ["AmpSafeFPN"],
}
# what the refusal of each other model config must say (every remaining .yml has no architecture section)
REFUSED = {
    "PaddleOCR/configs/det/det_r18_vd_ct.yml": "no safe variant for Architecture.Neck.name: CTFPN",
    "PaddleOCR/configs/det/det_r50_vd_east.yml": "no safe variant for Architecture.Neck.name: EASTFPN",
    "PaddleOCR/configs/det/det_r50_vd_pse.yml": "no safe variant for Architecture.Neck.name: FPN",
    "PaddleOCR/configs/rec/PP-OCRv4/ch_PP-OCRv4_rec.yml": "Architecture has no Neck section",
    "PaddleOCR/configs/rec/PP-OCRv4/ch_PP-OCRv4_rec_ampO2_ultra.yml": "Architecture has no Neck section",
    "PaddleOCR/configs/rec/PP-OCRv4/PP-OCRv4_server_rec_ampO2_ultra.yml": "Architecture has no Neck section",
    "PaddleDetection/configs/ppyolo/ppyolo_mbv3_small_coco.yml": "PPYOLOFPN builds every conv as a conv + BatchNorm",
    "PaddleDetection/configs/ppyolo/_base_/ppyolo_mbv3_small.yml": "PPYOLOFPN builds every conv as a conv + BatchNorm",
    "PaddleDetection/configs/ppyolo/ppyolo_tiny_650e_coco.yml": "PPYOLOTinyFPN builds every conv as a conv + BatchNorm",
    "PaddleDetection/configs/ppyolo/_base_/ppyolo_tiny.yml": "PPYOLOTinyFPN builds every conv as a conv + BatchNorm",
    "PaddleDetection/dygraph/configs/ppyolo/ppyolo_r50vd_dcn_1x_coco.yml": "PPYOLOFPN builds every conv",
    "PaddleDetection/dygraph/configs/ppyolo/_base_/ppyolo_r50vd_dcn.yml": "PPYOLOFPN builds every conv",
    "PaddleDetection/configs/yolov3/_base_/yolov3_mobilenet_v1.yml": "YOLOv3FPN builds every conv",
    "PaddleDetection/dygraph/configs/yolov3/_base_/yolov3_mobilenet_v1.yml": "YOLOv3FPN builds every conv",
    "PaddleDetection/dygraph/configs/yolov3/yolov3_mobilenet_v1_270e_coco.yml": "YOLOv3FPN builds every conv",
    "PaddleDetection/configs/ppyoloe/ppyoloe_crn_s_300e_coco.yml": "CustomCSPPAN builds every conv as a conv + BatchNorm",
    "PaddleDetection/configs/ppyoloe/_base_/ppyoloe_crn.yml": "CustomCSPPAN builds every conv as a conv + BatchNorm",
}
NO_ARCHITECTURE = "has no architecture section"


CONFIG_COPIES = ("PaddleOCR", "PaddleDetection")  # the config copies; PaddleOCR-src is a whole source tree


def all_configs() -> list[str]:
    """Every config of the upstream config copies (not of the source trees beside them, whose hundreds of configs
    the trainer tests read); without shared/, those the package ships."""
    from ampsafe_lab.workloads.upstream import PACKAGED

    root = UPSTREAM if UPSTREAM.is_dir() else PACKAGED
    return sorted(str(p.relative_to(root)) for top in CONFIG_COPIES for p in (root / top).rglob("*.yml"))
