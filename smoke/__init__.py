"""The post-start checks (`make smoke`): the server answers over the OpenAI API, its counters
move, and its log shows the start and the KV cache geometry the profile promises. The vLLM
metric names they and the serving tools read are `smoke.metrics`.

`smoke` imports the profile model from `launch`; nothing below it imports `smoke`.
"""
