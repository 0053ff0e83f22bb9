"""The `train` study kind (workbench.recipes.train.recipe): its loop and its report."""
