"""Patch policies (``island``, ``convbn``, ``rescale``, ``rewrite``), one small module each, behind ``ampsafe.patch``."""
