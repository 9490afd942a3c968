"""Post-start checks: the server answers over the OpenAI API and its log shows the geometry.

`smoke` imports the profile model from `launch`; `launch` never imports `smoke`.
"""
