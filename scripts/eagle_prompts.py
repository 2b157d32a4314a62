"""The built-in chat prompts scripts/train_eagle.py has the target answer (its training text), and
which of them are held out."""
from __future__ import annotations

import random

# ~150 varied asks, "|"-separated (a list of quoted strings is twice as long)
QUESTIONS = [q.strip() for q in """
Why is the sky blue? | Explain photosynthesis in simple terms. | How do vaccines work? | What is a black hole? | Why
do we have seasons? | How does a rainbow form? | What is the difference between weather and climate? | Explain how
DNA stores information. | What causes earthquakes? | How do magnets work? | Why is the ocean salty? | What is the
speed of light and why does it matter? | Explain the water cycle. | How do plants know which way is up? | What are
the three states of matter? | Explain Newton's three laws of motion. | What is an atom made of? | How do bees make
honey? | Why do cats purr? | How does the human heart pump blood? | What is entropy? | Write a Python function that
reverses a string. | Explain what a hash table is. | What is the difference between a list and a tuple in Python? |
How does binary search work? | Write a SQL query that counts orders per customer. | What is recursion? Give an
example. | Explain the difference between TCP and UDP. | What does the git rebase command do? | Write a JavaScript
function to check if a number is prime. | What is a race condition? | Explain Big O notation with examples. | How do
I read a CSV file in Python? | What is object-oriented programming? | Write a bash one-liner to count lines in all
.txt files. | Explain what an API is to a beginner. | What is the difference between a process and a thread? | How
does garbage collection work? | Write a function to compute Fibonacci numbers iteratively. | What is a linked list?
| Explain how HTTPS keeps data private. | What is unit testing and why do it? | How do I make a simple tomato sauce?
| Give me a recipe for pancakes. | How long should I boil an egg? | What is the secret to crispy roast potatoes? |
How do I cook rice on the stove? | Suggest a quick vegetarian dinner. | How do I make bread at home? | What spices
go well with chicken? | How do I store fresh herbs? | Explain how to make a basic vinaigrette. | How do I bake
chocolate chip cookies? | What is the difference between baking soda and baking powder? | How do I make a good cup
of coffee? | Who was Julius Caesar? | What caused the First World War? | Why did the Roman Empire fall? | What was
the Industrial Revolution? | Who built the pyramids of Giza? | What was the Renaissance? | Summarize the causes of
the French Revolution. | Who was Marie Curie? | What was the Silk Road? | Why was the printing press important? |
Describe the Apollo 11 mission. | Who was Genghis Khan? | What was the Cold War? | What happened at the Boston Tea
Party? | Who invented the telephone? | A train travels 60 km in 45 minutes. What is its speed in km/h? | If I buy 3
apples at 40 cents each and pay with 2 dollars, how much change do I get? | A rectangle is 7 m long and 4 m wide.
What are its area and perimeter? | What is 15% of 240? | Solve for x: 3x + 7 = 25. | How many seconds are there in a
day? | A recipe needs 2 cups of flour for 12 cookies. How much flour for 30 cookies? | What is the sum of the angles
in a triangle? | Explain what a prime number is. | If a shirt costs 25 dollars after a 20% discount, what was the
original price? | What is the square root of 144? | Tom is twice as old as Sam. In 5 years their ages sum to 40. How
old is Sam? | Convert 100 degrees Fahrenheit to Celsius. | What is the probability of rolling two sixes? | Explain
the Pythagorean theorem. | What is the average of 4, 8, 15, 16, 23 and 42? | Write a short poem about the sea. |
Write a haiku about autumn. | Write a thank-you note to a teacher. | Write a short story about a robot who learns to
paint. | Write a product description for a water bottle. | Write an email asking my manager for a day off. | Give me
a catchy slogan for a bakery. | Write a limerick about a cat. | Describe a sunset in three sentences. | Write a
birthday message for a friend. | Write the opening line of a mystery novel. | Write a motivational message for
students before exams. | Write a tweet announcing a new coffee shop. | Write a short dialogue between a dog and a
cat. | Give me three tips for better sleep. | How can I improve my focus while studying? | What are the benefits of
regular exercise? | How do I start running as a beginner? | How can I save money on groceries? | What should I pack
for a weekend hiking trip? | How do I prepare for a job interview? | Give me tips for learning a new language. | How
do I care for a houseplant? | What is a healthy breakfast? | How can I reduce stress? | How do I write a good
resume? | What are good habits for a productive morning? | Summarize the plot of Romeo and Juliet. | Who wrote Pride
and Prejudice and what is it about? | What is the capital of Australia? | Name the planets of the solar system. |
What is the longest river in the world? | Why is Mount Everest so tall? | What language is spoken in Brazil? | What
is the largest desert on Earth? | Explain what inflation is. | What is a stock? | How does compound interest work? |
What is supply and demand? | Explain what a budget is and why it helps. | What is cryptocurrency? | What is machine
learning? | Explain what a neural network is. | What is the difference between AI and machine learning? | How does a
search engine work? | What is cloud computing? | How does GPS find my location? | Translate 'good morning, how are
you?' into French. | What does 'carpe diem' mean? | Give me five synonyms for happy. | What is the difference
between affect and effect? | Explain what a metaphor is with an example. | What is a palindrome? Give examples. |
What are the rules of chess in brief? | How is football scored? | Explain the rules of tennis. | What is meditation
and how do I start? | Why do we dream? | How many bones are in the human body? | List three pros and cons of remote
work. | Compare electric cars and petrol cars. | Should I learn Python or JavaScript first? | Explain the greenhouse
effect. | How does recycling help the environment? | What is renewable energy? | Plan a one-day trip to Paris. |
What should I know before adopting a dog? | How do airplanes stay in the air?
""".replace("\n", " ").split("|")]
SYSTEMS = [None, "You are a concise assistant. Answer briefly.",
           "You are a friendly teacher who explains step by step.",
           "You are an expert who gives detailed, well-structured answers."]


def build_prompts(num_prompts: int, seed: int) -> tuple[list[list[dict]], list[bool]]:
    """num_prompts chats and which are held out: about 10%, on a tenth of QUESTIONS that training never sees."""
    rng = random.Random(seed)
    questions = QUESTIONS[:]
    rng.shuffle(questions)
    held_asks = questions[:max(1, len(questions) // 10)]
    pool = questions[len(held_asks):]
    num_held = max(1, min(num_prompts // 10, len(held_asks) * len(SYSTEMS)))
    users = [(i, held_asks) for i in range(num_held)] + [(i, pool) for i in range(num_prompts - num_held)]
    chats = []
    for i, asks in users:
        rounds, j = divmod(i, len(asks))
        system = SYSTEMS[(j + rounds) % len(SYSTEMS)]  # a repeated ask gets another system prompt, not a duplicate
        ask = asks[j]
        chats.append(([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": ask}])
    return chats, [asks is held_asks for _, asks in users]
