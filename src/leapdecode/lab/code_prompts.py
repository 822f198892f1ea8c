"""HumanEval problems the benchmark suites ask (draft heads must never train on them) and how a suite frames a code
problem. Here, below both `bench` and `heads`, because both need them."""

HUMANEVAL_IDS = [f"HumanEval/{i}" for i in range(0, 160, 20)]
CODE_INSTRUCTION = "Complete the following Python function. Reply with the full function in a Python code block."
