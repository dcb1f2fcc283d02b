"""The runtime teacher: the PPO expert (:mod:`agent.experts.policy`) and its label rules
(:mod:`agent.experts.rules`). Training the expert with PPO is :mod:`agent.train.ppo`'s."""
