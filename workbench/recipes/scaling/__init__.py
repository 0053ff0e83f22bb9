"""The `scaling` study kind (workbench.recipes.scaling.recipe): its loop and its report."""
