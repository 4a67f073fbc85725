"""The dataset layouts trainyard validates, by name, with the function that runs their expectation suites:
a table that imports nothing, so the ingest DAG's form and the CLI offer the same choices as upload takes."""

VALIDATORS = {
    "image_classification": "trainyard.data.classification:validate_classification",
    "coco_detection": "trainyard.data.detection:validate_detection",
    "parallel_text": "trainyard.data.parallel_text:validate_parallel_text",
    "image_folder": "trainyard.data.image_folder:validate_image_folder",
}
KINDS = tuple(VALIDATORS)
