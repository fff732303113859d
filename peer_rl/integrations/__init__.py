"""Bridges to other RL stacks. Each module imports its stack at import time and is usable only
where that stack is installed (verl_reward: in the environment scripts/setup_verl.sh makes)."""
