"""Twenty everyday chat prompts for the real-model tests (not Spec-Bench, which is for evaluation)."""

PROMPTS = [
    "Explain how a hash table works.",
    "Write a short poem about autumn leaves.",
    "What are the main causes of inflation?",
    "Give me three tips for a job interview.",
    "How do vaccines train the immune system?",
    "Write a Python function that reverses a string.",
    "What is the difference between weather and climate?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "Why is the sky blue?",
    "List five healthy breakfast ideas.",
    "How does a bicycle stay upright?",
    "Translate 'Good morning, how are you?' into French.",
    "What is 12 times 15? Explain your steps.",
    "Describe the water cycle.",
    "Write an email asking a colleague to reschedule a meeting.",
    "What is photosynthesis?",
    "How do I make a cup of green tea?",
    "Explain recursion to a ten-year-old.",
    "What were the causes of the French Revolution?",
    "Suggest a name for a bakery and explain why.",
]
