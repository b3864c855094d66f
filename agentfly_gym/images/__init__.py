"""Container images built offline: the Debian base (:mod:`.base`), recipes under ``envs/``
(:mod:`.build`) and OpenEnv environments' images (:mod:`.openenv`)."""
