"""trainyard: an AI training production line on Apache Airflow 3 (the Airflow-free library)."""

__version__ = "0.1.0"
# The image the Kubernetes launcher runs by default: what `make image` builds from ./Dockerfile.
TRAINER_IMAGE = f"trainyard/trainer:{__version__}"
