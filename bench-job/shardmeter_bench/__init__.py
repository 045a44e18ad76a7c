"""The ShardMeter benchmark Job: profiles a GPU pool and fits cost-model coefficients."""
