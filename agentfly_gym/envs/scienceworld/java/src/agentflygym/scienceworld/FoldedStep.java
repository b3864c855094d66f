package agentflygym.scienceworld;

import scienceworld.runtime.pythonapi.PythonInterface;

/**
 * One py4j round trip for a ScienceWorld step: calls, on the package's own
 * {@code PythonInterface}, exactly what the package's Python {@code ScienceWorldEnv.step} calls
 * first (step, getScore, getCompleted, getNumMoves, in that order) and returns them as one string.
 *
 * <p>Encoding (read by {@code java_fold.py}'s {@code decode}): the score as
 * {@code Double.toString} (what py4j itself sends for a double, so Python's {@code float()}
 * reads the same value), the completion flag ({@code true}/{@code false}), the move counter
 * ({@code null} for a null {@code Integer}), each followed by a newline, then {@code s} and the
 * observation text (which may contain anything, newlines included) or {@code n} for a null one.
 *
 * <p>Loaded at run time into the JVM the package starts (through a class loader whose parent is
 * {@code PythonInterface}'s), so it is compiled for Java 8, the release the package's jar targets.
 */
public final class FoldedStep {
    private final PythonInterface server;

    /** Bind the package's {@code PythonInterface} (passed as an Object: py4j finds this constructor). */
    public FoldedStep(Object server) {
        this.server = (PythonInterface) server;
    }

    /** Apply {@code action}, then read score, completion and moves: the encoded answers. */
    public String step(String action) {
        String observation = server.step(action);
        return encode(server, observation, true);
    }

    /** Score, completion and moves without stepping (no observation): checks the linkage. */
    public String state() {
        return encode(server, null, false);
    }

    private static String encode(PythonInterface s, String observation, boolean withObservation) {
        double score = s.getScore();
        boolean completed = s.getCompleted();
        Integer moves = s.getNumMoves();
        StringBuilder b = new StringBuilder(64 + (observation == null ? 0 : observation.length()));
        b.append(Double.toString(score)).append('\n');
        b.append(completed ? "true" : "false").append('\n');
        b.append(moves == null ? "null" : moves.toString()).append('\n');
        if (withObservation) {
            if (observation == null) {
                b.append('n');
            } else {
                b.append('s').append(observation);
            }
        }
        return b.toString();
    }
}
