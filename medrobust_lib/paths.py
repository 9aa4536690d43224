"""On-disk locations the project derives from its configuration.

:data:`RECORD_FILES`: where the embedded demo writes its VLM record files, relative to the demo
root (read by the VLM configuration when the demo is enabled, written by the demo generator).
"""

from __future__ import annotations

RECORD_FILES: dict[str, str] = {
    "omnimedvqa": "records/omnimedvqa.json",
    "yesno_paraphrases": "records/yesno_paraphrases.jsonl",
    "roco_captions": "records/roco_captions.csv",
    "roco_images": "records/roco_images.csv",
    "mecovqa_grounding": "records/mecovqa_grounding.json",
    "splits": "records/splits.csv",
}
"""Record name -> path relative to the demo root."""
