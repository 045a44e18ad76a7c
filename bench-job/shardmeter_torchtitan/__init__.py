"""torchtitan config registry for ShardMeter's launched islands: ``--module
shardmeter_torchtitan --config llama3_8b_torchft`` (see ``config_registry``)."""
