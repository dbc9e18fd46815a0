"""memlib.build: the single-process composition of the build stages (no Ray here).

``process_tenant(turns, cfg, embedder, nlp=None)`` -> :class:`TenantOutput`; the named
recipes live in :mod:`memlib.build.recipe`; ``pipelines/`` runs the same code on Ray.
"""
from memlib.build.compose import TenantOutput, process_tenant
from memlib.build.recipe import DEFAULT_RECIPE, RECIPES, BuildStage, JobStage, get_recipe

__all__ = ["TenantOutput", "process_tenant", "DEFAULT_RECIPE", "RECIPES", "BuildStage", "JobStage", "get_recipe"]
