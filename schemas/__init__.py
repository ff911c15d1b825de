"""The JSON Schemas (draft 2020-12) of pipeplan's files, installed as package data of ``pipeplan.schemas``."""
