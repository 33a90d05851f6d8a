"""Where each upstream neck of the zoo is built for tests/patches/test_neck_zoo.py: a config of its own tree (whose
neck section gives the arguments) and the feature maps its backbone hands it, as (channels, height, width).

The channel counts are those of the config's backbone, read off the backbone built by the tree's own code
(``out_channels`` in PaddleOCR, ``out_shape`` in ppdet) for a 64 px image (32 x 100 for recognition); the maps are
random, since the check reads paths, not values. Necks no config of the tree names say so and are built at the
channels of a backbone their family uses.
"""

from __future__ import annotations

# PaddleOCR: (config under configs/, feature maps)
_MV3_LARGE_05 = ((16, 16, 16), (24, 8, 8), (56, 4, 4), (480, 2, 2))  # MobileNetV3 large x0.5 (det_mv3_*)
_R50 = ((256, 16, 16), (512, 8, 8), (1024, 4, 4), (2048, 2, 2))  # ResNet(_vd) 50
_R18 = ((64, 16, 16), (128, 8, 8), (256, 4, 4), (512, 2, 2))  # ResNet_vd 18 (det_r18_vd_ct)
OCR: dict[str, tuple[str, tuple]] = {
    "DBFPN": ("det/det_mv3_db.yml", _MV3_LARGE_05),
    "RSEFPN": ("det/ch_PP-OCRv4/ch_PP-OCRv4_det_student.yml", ((12, 16, 16), (18, 8, 8), (42, 4, 4), (360, 2, 2))),
    "LKPAN": ("det/ch_PP-OCRv4/ch_PP-OCRv4_det_teacher.yml", ((256, 16, 16), (512, 8, 8), (768, 4, 4), (1024, 2, 2))),
    "FPN": ("det/det_mv3_pse.yml", _MV3_LARGE_05),
    "EASTFPN": ("det/det_mv3_east.yml", _MV3_LARGE_05),
    "FCEFPN": ("det/det_r50_vd_dcn_fce_ctw.yml", _R50[1:]),  # out_indices [1, 2, 3]
    "FPN_UNet": ("det/det_r50_drrg_ctw.yml", _R50),
    "CTFPN": ("det/det_r18_vd_ct.yml", _R18),
    "SASTFPN": (  # ResNet_SAST 50: the image and six stages
        "det/det_r50_vd_sast_icdar15.yml",
        ((3, 64, 64), (64, 32, 32), (256, 16, 16), (512, 8, 8), (1024, 4, 4), (2048, 2, 2), (2048, 1, 1)),
    ),
    "PGFPN": (  # ResNet 50 of PGNet: the image and six stages
        "e2e/e2e_r50_vd_pg.yml",
        ((3, 64, 64), (64, 32, 32), (256, 16, 16), (512, 8, 8), (1024, 4, 4), (2048, 2, 2), (2048, 1, 1)),
    ),
    "CSPPAN": ("table/SLANet.yml", ((64, 16, 16), (128, 8, 8), (256, 4, 4), (512, 2, 2))),  # PPLCNet x1.0
    "PRENFPN": ("rec/rec_efficientb3_fpn_pren.yml", ((48, 8, 32), (136, 4, 16), (384, 2, 8))),  # 64 x 256
    "RFAdaptor": ("rec/rec_resnet_rfl_att.yml", ((512, 1, 26), (512, 1, 26))),  # ResNetRFL: (visual, sequence)
    "SequenceEncoder": ("rec/rec_icdar15_train.yml", ((288, 1, 25),)),  # MobileNetV3 large x0.5, rec
    # no config names TableFPN: ResNet18_vd's channels, the only ones its residual (c5 + fuse, 512) accepts
    "TableFPN": ("", _R18),
}
OCR_TABLEFPN_ARGS = {"out_channels": 512}
# SequenceEncoder's variant changes the neck only where a Linear ends it: 'fc' (no config names it; built on
# rec_icdar15_train.yml's section) and a cascade built with_linear, its one config's (ResNet32: 512 x 1 x 26)
OCR_VARIANT_SETTINGS = {"SequenceEncoder": {"encoder_type": "fc"}}
OCR_CASCADE = ("rec/rec_r32_gaspin_bilstm_att.yml", ((512, 1, 26),))

# PaddleDetection: (config under configs/, the neck's section there, feature maps for a 128 px image)
_C3_5 = lambda c3, c4, c5: ((c3, 16, 16), (c4, 8, 8), (c5, 4, 4))  # noqa: E731 - strides 8, 16, 32
DET: dict[str, tuple[str, tuple]] = {
    "FPN": ("faster_rcnn/faster_rcnn_r50_fpn_1x_coco.yml", ((256, 32, 32), (512, 16, 16), (1024, 8, 8), (2048, 4, 4))),
    "HRFPN": ("hrnet/faster_rcnn_hrnetv2p_w18_1x_coco.yml", ((18, 32, 32), (36, 16, 16), (72, 8, 8), (144, 4, 4))),
    "CLRFPN": ("clrnet/clrnet_resnet18_culane.yml", _C3_5(128, 256, 512)),  # CLRResNet 18's last three
    "YOLOv3FPN": ("yolov3/yolov3_darknet53_270e_coco.yml", _C3_5(256, 512, 1024)),
    "PPYOLOFPN": ("ppyolo/ppyolo_mbv3_small_coco.yml", ((48, 8, 8), (96, 4, 4))),
    "PPYOLOTinyFPN": ("ppyolo/ppyolo_tiny_650e_coco.yml", _C3_5(24, 56, 80)),
    "PPYOLOPAN": ("ppyolo/ppyolov2_r50vd_dcn_365e_coco.yml", _C3_5(512, 1024, 2048)),
    "CustomCSPPAN": ("ppyoloe/ppyoloe_crn_s_300e_coco.yml", _C3_5(128, 256, 512)),
    "YOLOCSPPAN": ("yolox/yolox_s_300e_coco.yml", _C3_5(128, 256, 512)),
    "CSPPAN": ("picodet/legacy_model/more_config/picodet_lcnet_1_0x_416_coco.yml", _C3_5(128, 256, 512)),
    "LCPAN": ("picodet/picodet_s_320_coco_lcnet.yml", _C3_5(96, 192, 384)),
    "DilatedEncoder": ("yolof/yolof_r50_c5_1x_coco.yml", ((2048, 4, 4),)),
    "TTFFPN": ("ttfnet/ttfnet_darknet53_1x_coco.yml", ((128, 32, 32), (256, 16, 16), (512, 8, 8), (1024, 4, 4))),
    "BlazeNeck": ("face_detection/blazeface_fpn_ssh_1000e.yml", ((96, 16, 16), (96, 8, 8))),
    "CenterNetDLAFPN": (
        "mot/fairmot/fairmot_dla34_30e_1088x608.yml",
        ((16, 128, 128), (32, 64, 64), (64, 32, 32), (128, 16, 16), (256, 8, 8), (512, 4, 4)),
    ),
    "CenterNetHarDNetFPN": (
        "mot/fairmot/fairmot_enhance_hardnet85_30e_1088x608.yml",
        ((96, 32, 32), (214, 16, 16), (458, 8, 8), (784, 4, 4)),
    ),
    "ChannelMapper": ("keypoint/petr/petr_resnet50_16x2_coco.yml", _C3_5(512, 1024, 2048)),
    # necks the configs name from outside ppdet.modeling.necks: RT-DETR's encoders (ppdet/modeling/transformers)
    # and ViTDet's pyramid (ppdet/modeling/backbones/vit_mae.py)
    "HybridEncoder": ("rtdetr/rtdetr_r18vd_6x_coco.yml", _C3_5(128, 256, 512)),  # ResNet18_vd's last three
    "MaskHybridEncoder": (  # PP-HGNetV2 S's four stages (return_idx [0, 1, 2, 3])
        "mask_rtdetr/mask_rtdetr_hgnetv2_s_6x_coco.yml",
        ((64, 32, 32), (256, 16, 16), (512, 8, 8), (1024, 4, 4)),
    ),
    "SimpleFeaturePyramid": ("group_detr/group_dino_vit_huge_4scale_1x_coco.yml", ((1280, 8, 8),)),  # ViT-H/16
    # no config names these two: built at the channels of a ResNet 50's last three stages (BiFPN) and of PicoDet's
    # CSPPAN inputs (ESPAN), their other arguments at their defaults
    "BiFPN": ("", _C3_5(512, 1024, 2048)),
    "ESPAN": ("", _C3_5(128, 256, 512)),
}
# RT-DETR's configs fix the encoder's position embedding for eval at eval_size [640, 640] (20 x 20 at stride 32):
# built for the 128 px image, in eval mode, the encoders get that image's size
_EVAL_128 = {"eval_size": [128, 128]}
DET_DEFAULT_ARGS = {"ESPAN": {"out_channels": 96}, "HybridEncoder": _EVAL_128, "MaskHybridEncoder": _EVAL_128}
# necks with a safe variant built again at a setting of another config, where the registry reads them as already
# safe (registry.SETTING_SAFE): TTFFPN with lite_neck (MobileNetV3 large's four stages)
DET_SETTINGS: dict[str, tuple[str, tuple]] = {
    "TTFFPN": ("ttfnet/pafnet_lite_mobilenet_v3_20x_coco.yml", ((72, 32, 32), (240, 16, 16), (672, 8, 8), (960, 4, 4))),
}
