"""PD: owned-page transfer from CP prefill ranks to a non-CP decode server over Mooncake."""
