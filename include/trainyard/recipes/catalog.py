"""The built-in recipes by name, as ``module:Class`` paths: a table that imports nothing, so the JobSpec
(:mod:`trainyard.spec`) takes its ``recipe`` choices from here without loading a recipe or torch."""

RECIPES = {
    "digits_cnn": "trainyard.recipes.digits:DigitsCNN",
    "centernet_detector": "trainyard.recipes.detection:CenterNetDetector",
    "transformer_translator": "trainyard.recipes.translation:TransformerTranslator",
    "resnet_classifier": "trainyard.recipes.resnet:ResNetClassifier",
}
