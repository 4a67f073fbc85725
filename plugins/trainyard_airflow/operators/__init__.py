"""Airflow operators. Import the heavy ones from their modules (``.training``); ``.launch`` is parse-light."""
