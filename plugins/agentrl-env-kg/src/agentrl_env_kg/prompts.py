"""What the agent reads: the instructions and tool schemas of AgentBench-FC's KG task.

The wording is AgentBench's (``src/server/tasks/knowledgegraph/const.py``, Apache-2.0), kept
verbatim so models tuned on AgentBench-FC see the prompt they know. The optional one-shot
example follows upstream's, with its typos fixed (upstream intersects ``#0`` with ``#2``
before ``#2`` exists, and its tool-call arguments hold a stray ``}``).
"""

from __future__ import annotations

from agentrl_core.env import assistant_tool_call, function_tool

INSTRUCTIONS = """ 
You are an intelligent agent tasked with answering questions based on the knowledge stored in a 
knowledge base (KB). You can utilize several tools to probe the KB and retrieve relevant 
information to answer the questions posed to you.
Use the tools provided effectively to navigate through the KB, find relationships, 
attributes, and intersections where applicable, and determine the most pertinent 
information to answer the questions.
Remember:
- A variable can be an entity or a set of entities as results from previous queries.
- You should always ensure the tool used is appropriate for the question's demands and 
follow the logical order where necessary (e.g., fetch relations before finding neighbors).
- After a variable is produced along the process, you need to judge whether a variable is 
the final answer to the question. Each variable is represented as an id starting from 0. 
For example, #0 is the first variable, #1 is the second variable, and so on.
- Once you identify the final answer to the question, respond with 'Final Answer: #id' 
where id is the identifier of the variable you determine to be the final answer. For 
example, if you think #3 is the final answer, you MUST respond with 'Final Answer: #3'. Do
not call tools regarding the commission of final answer!!!
- You need to execute one action at a time and can perform a maximum of {max_round} actions to find
the answer.
- You should use the supplied tools unless the final answer is identifies.
Your thoughtful application of these tools and careful consideration of the interactions 
will guide you to the correct answers.
Note that you must finish the task in {max_round} rounds! Arrange your attempts according to it!
"""  # noqa: W291 - upstream's trailing spaces are part of the prompt

TOOLS = [
    function_tool(
        "get_relations",
        "Fetches all relations associated with a given entity or variable, which helps in navigating the "
        "Knowledge Base (KB) to find useful connections.",
        {"variable": {"type": "string", "description": "The entity or variable whose relations are to be fetched. "
                      "Should be an existing entity or a result of a previous query."}},
        required=["variable"],
    ),
    function_tool(
        "get_neighbors",
        "Returns all entities connected to a given variable through a specified relation, can only be used after "
        "identifying valid relations with get_relations().",
        {
            "variable": {"type": "string", "description": "The subject entity or variable to find neighbors for."},
            "relation": {"type": "string", "description": "The relationship through which neighbors are connected to the subject."},
        },
        required=["variable", "relation"],
    ),
    function_tool(
        "intersection",
        "Computes the intersection of two sets of entities or variables of the same type.",
        {
            "variable1": {"type": "string", "description": "The first set of entities or a variable."},
            "variable2": {"type": "string", "description": "The second set of entities or a variable."},
        },
        required=["variable1", "variable2"],
    ),
    function_tool(
        "get_attributes",
        "Retrieves all numerical attributes of a given variable, especially valuable when seeking for entities "
        "with extreme attributes (max or min).",
        {"variable": {"type": "string", "description": "The variable whose numerical attributes are to be fetched."}},
        required=["variable"],
    ),
    function_tool(
        "argmax",
        "Finds the entity with the maximum value of the specified attribute, can be used after identifying valid "
        "attributes with get_attributes().",
        {
            "variable": {"type": "string", "description": "The variable or set of entities among which to find the maximum."},
            "attribute": {"type": "string", "description": "The attribute to maximize over the entities."},
        },
        required=["variable", "attribute"],
    ),
    function_tool(
        "argmin",
        "Finds the entity with the minimum value of the specified attribute, can be used after identifying valid "
        "attributes with get_attributes().",
        {
            "variable": {"type": "string", "description": "The variable or set of entities among which to find the minimum."},
            "attribute": {"type": "string", "description": "The attribute to minimize over the entities."},
        },
        required=["variable", "attribute"],
    ),
    function_tool(
        "count",
        "Counts the number of entities within a given variable.",
        {"variable": {"type": "string", "description": "The variable or set of entities to count."}},
        required=["variable"],
    ),
]

NO_CALL = "No valid function calls found! Need to recheck the function calls."


def one_shot() -> list[dict]:
    """A worked example (upstream's, corrected), inserted before the question when configured."""
    calls = [
        ("Thought: I need to first find engines with gas-generator cycle. To achieve this, I will query the KB to find "
         "relations connected to the entity 'Gas-generator cycle' and see if any of them can help me find the answer.",
         "get_relations", {"variable": "Gas-generator cycle"},
         "Observation: [spaceflight.rocket_engine_cycle.rocket_engines, spaceflight.satellite.orbiting, "
         "spaceflight.rocket_stage.fuel, spaceflight.satellite_manufacturer.spacecraft_manufactured, automotive.fuel.engines]"),
        ("Thought: From the above relations, I might use spaceflight.rocket_engine_cycle.rocket_engines to find the "
         "engines of Gas-generator cycle.",
         "get_neighbors", {"variable": "Gas-generator cycle", "relation": "spaceflight.rocket_engine_cycle.rocket_engines"},
         "Observation: variable #0, which are instances of spaceflight.bipropellant_rocket_engine"),
        ("Thought: I also need to find engines with kerosene. To achieve this, I will query the KB to find relations "
         "connected to the entity 'Kerosene'.",
         "get_relations", {"variable": "Kerosene"},
         "Observation: [spaceflight.satellite_manufacturer.spacecraft_manufactured, automotive.fuel.engines, "
         "spaceflight.rocket_engine_cycle.rocket_engines]"),
        ("Thought: From the above relations, I might use spaceflight.rocket_engine_cycle.rocket_engines to find engines "
         "with kerosene cycle.",
         "get_neighbors", {"variable": "Kerosene", "relation": "spaceflight.rocket_engine_cycle.rocket_engines"},
         "Observation: variable #1, which are instances of spaceflight.bipropellant_rocket_engine"),
        ("Thought: The engines I need use both, so I intersect #0 and #1.",
         "intersection", {"variable1": "#0", "variable2": "#1"},
         "Observation: variable #2, which are instances of spaceflight.bipropellant_rocket_engine"),
        ("Thought: From the above relations, I might use spaceflight.rocket_engine.designed_by to find the designer of "
         "the engines.",
         "get_neighbors", {"variable": "#2", "relation": "spaceflight.rocket_engine.designed_by"},
         "Observation: variable #3, which are instances of spaceflight.rocket_engine_designer"),
    ]
    messages: list[dict] = [{
        "role": "user",
        "content": "Question: the bipropellant rocket engine with kerosene and gas-generator cycle is designed by who? \n"
                   "Entities: [Gas-generator cycle, Kerosene]",
    }]
    for i, (thought, tool, args, observation) in enumerate(calls):
        call_id = f"call_example_{i}"
        messages.append(assistant_tool_call(tool, args, call_id=call_id, content=thought))
        messages.append({"role": "tool", "tool_call_id": call_id, "content": observation})
    messages.append({
        "role": "assistant",
        "content": "Thought: #3 is the final answer to the question, which represents the target rocket engine "
                   "designer. Final Answer: #3",
    })
    return messages
