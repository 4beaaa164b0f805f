"""The helpers of causes/late_helper_seed.py: a program's own module, not an installed one."""
