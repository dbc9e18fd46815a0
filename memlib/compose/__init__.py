"""memlib.compose: the single-process composition of the build steps (no Ray here).

``process_tenant(turns, cfg, encoder)`` -> :class:`TenantOutput`; the named
recipes live in :mod:`memlib.compose.recipe`; ``pipelines/`` runs the same code on Ray.
"""
from memlib.compose.recipe import DEFAULT_RECIPE, RECIPES, Phase, Step, get_recipe
from memlib.compose.reference import TenantOutput, process_tenant

__all__ = ["TenantOutput", "process_tenant", "DEFAULT_RECIPE", "RECIPES", "Phase", "Step", "get_recipe"]
