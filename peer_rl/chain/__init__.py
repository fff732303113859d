"""`peer-rl chain`: pipelines of stages, resumable, and their report."""
