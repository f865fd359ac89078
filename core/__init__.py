"""The foundation: errors, registries, cache, config, files, timing, the trial; every layer above imports it."""
