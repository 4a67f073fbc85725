"""The built-in recipes and their built-in data sources by name, as ``module:attribute`` paths: tables
that import nothing, so the JobSpec (:mod:`trainyard.spec`) takes its ``recipe`` and ``dataset.source``
choices from here without loading a recipe or torch."""

RECIPES = {
    "digits_cnn": "trainyard.recipes.digits:DigitsCNN",
    "centernet_detector": "trainyard.recipes.detection:CenterNetDetector",
    "transformer_translator": "trainyard.recipes.translation:TransformerTranslator",
    "resnet_classifier": "trainyard.recipes.resnet:ResNetClassifier",
}

# dataset.source -> (the recipe it is data for, "module:function(store, repo, branch)" that ingests it)
SOURCES = {
    "sklearn_digits": ("digits_cnn", "trainyard.data.classification:ingest_digits"),
    "synthetic_shapes": ("centernet_detector", "trainyard.data.shapes:ingest_shapes"),
    "synthetic_translation": ("transformer_translator", "trainyard.data.synthetic_text:ingest_synthetic_text"),
    "synthetic_photos": ("resnet_classifier", "trainyard.data.photos:ingest_photos"),
}
