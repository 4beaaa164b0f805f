"""What runs in a rank that detcheck launched: the start-up hook (``startup``, run by
``detcheck.pth``), the world of one (``single_rank``) and arrival order's perturbation
(``arrival``). Above the front ends, which it starts; nothing of the package imports it.
"""
