"""`peer-rl plan`: where a recipe's pools land on a cluster and what each GPU holds, worked out
from the recipe and the models' config.json before any weight is loaded."""
